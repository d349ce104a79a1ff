# Injected into Horovod's CMake project (CMAKE_PROJECT_INCLUDE) by scripts/build_horovod.sh.
# Horovod 0.28.1 asks CMake for C++14, but the headers of torch >= 2.1 need C++17: make CMake's
# "C++14" flag mean C++17 so every target Horovod declares compiles against current torch.
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++17")
# GCC 13 no longer pulls <string>, <stdexcept> and <cstdint> in through other standard headers, and
# Horovod 0.28.1's sources rely on that (group_table.h, common.h; seen failing on the GPU device
# machine's GCC 13.3): include them in every C++ unit. Harmless where older compilers build it.
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include string>"
                    "$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include stdexcept>"
                    "$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include cstdint>")

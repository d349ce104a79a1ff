"""The reference training job built on the library: ``hvd-async`` (:mod:`.cli`), the options and the
job's description (:mod:`.config`, :mod:`.jobspec`), the process on each rank (:mod:`.train`,
:mod:`.job_process`, :mod:`.worker_loop`), its checkpoints and rendezvous (:mod:`.jobstate`), the
``mpirun`` it starts (:mod:`.launcher`) and the installation's check (:mod:`.doctor`).

The library (:mod:`hvd_async.optimizer`, :mod:`hvd_async.runtime`, :mod:`hvd_async.server`,
:mod:`hvd_async.registry`, the algorithms, rules and transports) imports nothing from here; a user's
own script needs only the library. The simulator (:mod:`hvd_async.sim`) runs this job's worker loop
on a virtual clock, so it sits beside the job, above the library.
"""

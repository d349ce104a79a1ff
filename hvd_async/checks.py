"""Small argument checks shared by the modules that validate user input."""


def is_int_at_least(value, minimum: int) -> bool:
    """True for a real ``int`` (not a bool) that is >= ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum

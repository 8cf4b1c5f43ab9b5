"""A failure as one line for an operator."""


def failure_text(failure: BaseException) -> str:
    """ "Type: message", without the type twice (aiokafka's messages start with it)."""
    name = type(failure).__name__
    text = str(failure) or name
    return text if text.startswith(name) else f"{name}: {text}"

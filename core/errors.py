"""Every error a user can cause has its own type and a message that says what was wrong and what to do, so the
CLI can print it as one line and API callers can catch exactly what they expect."""


class MinisglError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidParamsError(MinisglError, ValueError):
    """A sampling parameter or an engine option is out of range."""


class InvalidConstraintError(InvalidParamsError):
    """A structured-output constraint that cannot be used: a JSON schema, regular expression or grammar that is
    malformed (the message names the part that is wrong)."""


class PromptFileError(MinisglError, ValueError):
    """A prompts file is missing, unreadable, empty or malformed (the message names the file and line)."""


class ModelLoadError(MinisglError):
    """A model could not be found, read or converted."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint's architecture is not one the engine implements."""


class RequestRejected(MinisglError, ValueError):
    """A request that can never run on this engine (an empty prompt, a token outside the vocabulary)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the request's field at fault, where it is one of its sampling parameters


class ContextLengthError(RequestRejected):
    """A request whose prompt plus max_tokens exceeds the context or the whole KV pool."""


class EngineDeadError(MinisglError, RuntimeError):
    """The engine's process died: nothing more can be answered."""


class EngineBusyError(MinisglError, RuntimeError):
    """The engine's loop is already running (on another thread): join it with submit() instead."""


class WorkerError(MinisglError, RuntimeError):
    """A tensor-parallel worker died or stopped answering."""


def one_line(exc: BaseException) -> str:
    """The first line of an underlying library's message: ours are shown on one line."""
    text = str(exc).strip().splitlines()
    return text[0].rstrip(":") if text else type(exc).__name__

"""Every error a caller of csr_ros can cause, in one place.

Messages are built first, then raised, and say what to do about the problem.
Internal invariants are asserts with a message, not these classes.
"""

from __future__ import annotations


class CsrError(Exception):
    """Base class of every error csr_ros raises on purpose."""


class ConfigError(CsrError, ValueError):
    """A parameter, YAML file or command-line value is missing or malformed."""


class MessageTypeNotInstalledError(ConfigError):
    """A configured ROS message type whose package is not installed (or does not import)."""


class ChunkError(CsrError, ValueError):
    """A state chunk cannot be appended as given. Nothing was appended."""


class EmptyChunkError(ChunkError):
    """The chunk text is empty (or only whitespace)."""


class NonUtf8ChunkError(ChunkError):
    """The chunk bytes are not valid UTF-8."""


class ChunkTooLargeError(ChunkError):
    """The chunk is larger than the configured token budget and the policy is 'reject'."""


class SpecialTokenInChunkError(ChunkError):
    """The chunk spells a control token and the text-mode policy is 'reject'."""


class ChunkOrderError(ChunkError):
    """A chunk arrived with a sequence number that is not the next one expected."""


class ContextOverflowError(CsrError):
    """A request or an extension would exceed the resource's context maximum."""


class ModelNotFoundError(CsrError, FileNotFoundError):
    """The model (or its tokenizer) is not installed or the path holds no model."""


class ModelIntegrityError(CsrError):
    """A downloaded model does not match its pinned size or sha256; nothing of it was kept."""


class CapsuleError(CsrError):
    """A capsule cannot be restored or loaded into this engine."""


class CapsuleMismatchError(CapsuleError):
    """The capsule was made by a different model (fingerprint differs)."""


class StaleCapsuleError(CapsuleError):
    """The committed state the capsule points into has been overwritten since."""


class StateMismatchError(CsrError):
    """A request's static tokens do not extend what the resource has committed."""


class ResourceError(CsrError):
    """A resource (local engine or inference server) failed to serve a request."""


class ResourceUnavailableError(ResourceError):
    """The resource cannot be reached or is not healthy."""


class ResourceTimeoutError(ResourceError):
    """The resource did not answer in time."""


class QueryCancelledError(CsrError):
    """A query was cancelled by its caller before it finished; no answer is returned."""


class ChunkLogError(CsrError):
    """The on-disk chunk log is unreadable or inconsistent."""


class ChunkLogFullError(ChunkLogError):
    """The chunk log's disk is full (or its file may grow no further): the record was not
    written, the log holds everything before it, and appending works again once space is freed."""


class PortInUseError(ConfigError):
    """A server's port is taken by another process (the message names its pid and command)."""


class ActionSpecError(ConfigError):
    """An action vocabulary (its spec strings or JSON schema) is malformed."""


class ActionParseError(CsrError, ValueError):
    """A decision's text is not an action of the vocabulary."""


class GatewayRequestError(CsrError, ValueError):
    """A request to `csr-ros gateway` is malformed or asks for what the gateway does not do."""


class GatewayBusyError(CsrError):
    """Every session slot of the gateway holds a session with a request in flight."""

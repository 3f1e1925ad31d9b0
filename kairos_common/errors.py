"""The error hierarchy of ``kairos_common``."""


class KairosCommonError(Exception):
    """Base class for errors raised by shared helpers."""


class ConfigError(KairosCommonError, ValueError):
    """A configuration file, environment variable or flag has a bad value."""


class WireFormatError(KairosCommonError, ValueError):
    """A message on the router/daemon/id-tracker contract is malformed."""


class WireVersionError(WireFormatError):
    """A message says it is of a wire version this side does not speak: the
    router, the daemons and id-tracker of one release change together."""


class IdentityError(KairosCommonError, ValueError):
    """An agent identity key is malformed, forged or altered."""

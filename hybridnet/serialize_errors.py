"""The error of hn.save / hn.load (apart, so the file readers can raise it without
importing one another)."""


class SerializationError(ValueError):
    """A file could not be saved or loaded as a hybridnet state archive."""

"""textutil 1.0: whitespace normalisation."""
__version__ = "1.0"


def normalize(text):
    return " ".join(text.split())

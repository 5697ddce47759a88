"""The test suite, a package so helpers import by path (``from tests.polling import ...``)
from tests and from bench alike."""

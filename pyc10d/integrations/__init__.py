"""Integrations of pyc10d with other libraries, each importing only pyc10d's public pieces.

Nothing else in pyc10d imports this package: an integration is loaded by its user, and the
library it integrates with (``torchft`` for ``integrations.torchft``) is needed only then.
"""

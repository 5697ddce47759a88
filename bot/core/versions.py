"""Whether two version strings name the same thing. Pure.

Two questions, two answers:

* ``same_release``: is what runs (or is installed) the version that was asked for? vLLM
  builds for a CUDA other than its main one carry a *local label* in the wheel's
  metadata only. Its ``setup.py`` (``get_vllm_version``) writes ``vllm/_version.py``
  first and appends ``+cu129`` (``+cu126``, ``+precompiled``, ``+rocm...``) to the
  wheel's version afterwards, or ``.cu129`` to a dev build's label that already has a
  ``+g<commit>``. So ``uv pip show``, uv's install report and the freeze say
  ``0.11.0+cu129`` while ``vllm.__version__`` and the server's ``/version`` say
  ``0.11.0``; a nightly says ``0.16.0rc2.dev313+g662205d34.cu129`` against
  ``0.16.0rc2.dev313+g662205d34``. These are the same release: the public versions are
  equal and one side's label is the other's with segments appended (none at all being
  the plain case). Two labels that differ otherwise (``+cu129`` against ``+cu126``) are
  two builds, never the same.
* ``same_build``: did a package change? Exact PEP 440 equality: ``0.11.0`` becoming
  ``0.11.0+cu129`` is another wheel, and the change list must show it.

Text that is no PEP 440 version is compared as text, so an unknown never matches more
than itself.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def _parse(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def same_build(a: str, b: str) -> bool:
    """Exactly the same version (PEP 440 normalised: ``1.0`` is ``1.0.0``)."""
    va, vb = _parse(a), _parse(b)
    if va is None or vb is None:
        return a == b
    return va == vb


def _label(v: Version) -> tuple[str, ...]:
    return tuple(v.local.split(".")) if v.local else ()


def same_release(a: str | None, b: str | None) -> bool:
    """Whether ``a`` and ``b`` name one release: equal public versions, and one local
    label a prefix of the other's (segment by segment; no label is a prefix of any).
    None (unknown) is never the same as anything."""
    if a is None or b is None:
        return False
    va, vb = _parse(a), _parse(b)
    if va is None or vb is None:
        return a == b
    if Version(va.public) != Version(vb.public):
        return False
    la, lb = _label(va), _label(vb)
    short, long = (la, lb) if len(la) <= len(lb) else (lb, la)
    return long[: len(short)] == short


def version_text(version: str | None) -> str:
    """A version as a person reads it: ``?`` where it was not read (a host that did not
    answer, a venv uv cannot read), never Python's ``None``."""
    return version or "?"


def change_text(before: str | None, after: str | None) -> str | None:
    """A run's version change as the terminal and the audit table show it: ``0.15.0 ->
    0.16.0``; a side not read (a run that ended before its install, a host that did not
    answer) is ``?``, never Python's ``None``; None when neither side is known."""
    if before is None and after is None:
        return None
    return f"{version_text(before)} -> {version_text(after)}"


# A CUDA build's local label, as PyTorch's indexes (download.pytorch.org/whl/cu129,
# .../cu130) and vLLM's (wheels.vllm.ai/<version>/cu129) label their wheels: the CUDA major
# then its one-digit minor (cu118, cu126, cu128, cu129, cu130). A dev build carries it
# after its ``+g<commit>`` (``.cu129``).
_CUDA_LABEL_SEGMENT = "cu"


def cuda_of_label(version: str) -> str | None:
    """The CUDA version a build's local label names (``2.13.0+cu129`` -> ``12.9``,
    ``+cu130`` -> ``13.0``); None for a version with no such label, or one that is no
    PEP 440 version (not known, never guessed)."""
    v = _parse(version)
    if v is None:
        return None
    for segment in _label(v):
        digits = segment[len(_CUDA_LABEL_SEGMENT) :]
        if segment.startswith(_CUDA_LABEL_SEGMENT) and len(digits) == 3 and digits.isdigit():
            return f"{int(digits[:2])}.{digits[2]}"
    return None


def cuda_label(cuda: str) -> str | None:
    """The label of the build for ``cuda`` (``12.9`` -> ``cu129``); None for text that is
    no ``major.minor`` of two digits and one (no such index exists)."""
    major, _, minor = cuda.partition(".")
    if len(major) == 2 and major.isdigit() and len(minor) == 1 and minor.isdigit():
        return f"cu{major}{minor}"
    return None

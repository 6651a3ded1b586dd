"""Read pickles that hold only numpy arrays and plain containers, refusing everything else.

``pickle.load`` runs whatever a file tells it to (a pickle can call ``os.system``); the published
mini-ImageNet caches of learn2learn are pickles of ``{"image_data": ndarray, "class_dict": {wnid: [index]}}``.
``load_array_pickle`` resolves only the few globals that rebuilding numpy arrays needs, so a malicious file
fails with ``UnpicklingError`` before any of its code runs.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, BinaryIO

# (module, name) that numpy arrays, dtypes and scalars pickle through, under numpy 1 and 2 module names.
ALLOWED_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),  # how Python 2 pickles of byte strings spell them
    }
)


class ArrayUnpickler(pickle.Unpickler):
    """An unpickler that resolves only ``ALLOWED_GLOBALS`` and no persistent ids."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"the pickle refers to {module}.{name}, which is not part of a numpy array; refusing to load it "
            "(only arrays, numbers, strings, lists and dicts are read)"
        )


def load_array_pickle(source: str | Path | BinaryIO) -> Any:
    """Unpickle a file of numpy arrays and plain containers without running any other code.

    Args:
        source: a path or a binary file object.

    Returns:
        The unpickled object.

    Raises:
        pickle.UnpicklingError: the pickle needs any other global (a class, a function) than
            ``ALLOWED_GLOBALS``; the message names it.

    Example:
        >>> import io
        >>> load_array_pickle(io.BytesIO(pickle.dumps({"a": [1, 2]})))
        {'a': [1, 2]}
        >>> load_array_pickle(io.BytesIO(pickle.dumps(print)))
        Traceback (most recent call last):
        ...
        _pickle.UnpicklingError: the pickle refers to builtins.print, which is not part of a numpy array; ...
    """
    if isinstance(source, (str, Path)):
        with open(source, "rb") as file:
            return ArrayUnpickler(file, encoding="latin1").load()
    return ArrayUnpickler(source, encoding="latin1").load()

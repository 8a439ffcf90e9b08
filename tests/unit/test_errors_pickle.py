"""Every KVSpecError crosses a process boundary whole: a fleet sweep's worker processes (and Ray) pickle the
error a point raises, and the command reports it in the parent."""

from __future__ import annotations

import inspect
import pickle

import pytest

from kvspec import errors

ERROR_CLASSES = sorted(
    (cls for cls in vars(errors).values() if inspect.isclass(cls) and issubclass(cls, errors.KVSpecError)),
    key=lambda cls: cls.__name__,
)


def _instance(cls: type[errors.KVSpecError]) -> errors.KVSpecError:
    if cls is errors.InsufficientKVCacheMemoryError:
        return errors.InsufficientKVCacheMemoryError(
            "too small",
            needed_bytes=1 << 30,
            available_bytes=-5,
            max_model_len=4096,
            estimated_max_model_len=0,
        )
    return cls("what went wrong")


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_an_error_survives_pickling(cls: type[errors.KVSpecError]) -> None:
    error = _instance(cls)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls and str(back) == str(error) and vars(back) == vars(error)


def test_the_capacity_figures_come_back() -> None:
    error = _instance(errors.InsufficientKVCacheMemoryError)
    back = pickle.loads(pickle.dumps(error))
    assert isinstance(back, errors.InsufficientKVCacheMemoryError)
    assert (back.needed_bytes, back.available_bytes, back.max_model_len, back.estimated_max_model_len) == (
        1 << 30,
        -5,
        4096,
        0,
    )

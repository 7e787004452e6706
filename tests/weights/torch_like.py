"""torch.save-format files written without torch: a zip whose <name>/data.pkl
pickles an OrderedDict of tensors the way torch.save does (storages as
persistent ids, tensors rebuilt by torch._utils._rebuild_tensor_v2), for the
fuzz seeds (tests/fuzz/make_seeds.py) and the hostile-file tests
(tests/weights/hostile.py). Stand-in modules named torch and torch._utils
make the pickler write the very globals torch.save writes."""
import collections
import io
import pickle
import struct
import sys
import types
import zipfile


def _stand_ins():
    if "torch._utils" in sys.modules and hasattr(sys.modules["torch._utils"], "_shardplan_stand_in"):
        return sys.modules["torch"], sys.modules["torch._utils"]
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")
    utils._shardplan_stand_in = True

    def _rebuild_tensor_v2(*args):
        raise RuntimeError("stand-in")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    FloatStorage = type("FloatStorage", (), {"__module__": "torch"})
    torch.FloatStorage = FloatStorage
    torch._utils = utils
    sys.modules.setdefault("torch", torch)
    sys.modules.setdefault("torch._utils", utils)
    return sys.modules["torch"], sys.modules["torch._utils"]


class _Tensor:
    def __init__(self, key, shape):
        self.key, self.shape = key, tuple(shape)

    def __reduce__(self):
        torch, utils = _stand_ins()
        strides, s = [], 1
        for d in reversed(self.shape):
            strides.insert(0, s)
            s *= d
        storage = ("storage", torch.FloatStorage, self.key, "cpu", s)
        return (utils._rebuild_tensor_v2, (_Storage(storage), 0, self.shape, tuple(strides), False, collections.OrderedDict()))


class _Storage:
    def __init__(self, pid):
        self.pid = pid


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, _Storage) else None


def state_dict_pickle(tensors):
    """data.pkl for {name: shape}; storage keys "0", "1", ..."""
    _stand_ins()
    d = collections.OrderedDict((n, _Tensor(str(i), s)) for i, (n, s) in enumerate(tensors.items()))
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(d)
    return buf.getvalue()


def floats(n, start=0.5):
    return struct.pack("<%df" % n, *[start * (i + 1) for i in range(n)])


def torch_zip(tensors, pkl=None, byteorder=b"little"):
    """A torch.save zip of {name: shape} (float32), records stored like torch's."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl if pkl is not None else state_dict_pickle(tensors))
        if byteorder is not None:
            z.writestr("archive/byteorder", byteorder)
        for i, shape in enumerate(tensors.values()):
            n = 1
            for d in shape:
                n *= d
            z.writestr("archive/data/%d" % i, floats(n))
        z.writestr("archive/version", b"3\n")
    return buf.getvalue()

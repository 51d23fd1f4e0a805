"""Assert tests judged outside the program's process.

An assert test (`assert add(1, 2) == 3`, a HumanEval `check(candidate)`, loops, helper variables) runs in a
*judge* process that never executes a line of the program. The program runs in its own process and answers
the judge's requests (call this, read that attribute, iterate this object) over two pipes with plain data.

What the judge trusts (`docs/rewards.md`, "What the judge trusts") is decided here, in one place:

* its own values: the test's literals, and every module or object it takes from a module. A name the test
  reads but does not bind resolves in the judge when it names a module (the standard library, numpy,
  pytest), when the program's source imports it from one (`from fractions import Fraction`, `import numpy as
  np`, `from math import *`), when it is one of `WELL_KNOWN` (`Fraction`, `Counter`, `isclose`, `pi`,
  `approx`, ...), or when the program's answer for it says it is one: whatever the program bound to that
  name, its own copy is never called;
* plain data decoded from the program's answers (`encode`/`decode`): numbers, strings, bytes, lists,
  tuples, dicts, sets, fractions, decimals, the `collections` types, numpy arrays, exceptions by their
  built-in base; rebuilt with the judge's own classes, so their `==` is the judge's;
* `Remote` handles for anything else. A handle answers calls, attributes, items, iteration, `len`, `str`;
  it yields no hash, no ordering, no equality with the test's data, no membership answer of the program's
  (`x in h` iterates `h` and compares in the judge) and no truth but the default one (an object that
  defines `__bool__` or `__len__` is refused). Two handles compare here on their data (`state`: their
  attributes, walked as far as they reach), never by the program's `__eq__`; their order is `Undecidable`.
  Where a verdict would hang on the program's word, the test fails. `StopIteration` from the program ends
  only a `next()`.

A test may pass its own functions and objects to the program (a key function, a callback, its own
`ListNode`s): they stay in the judge, and the program calls them back through the same pipes, for calls,
items, iteration and public attributes only.

Both runners load this file by path (it is stdlib only); neither has its directory on `sys.path`.
"""

import base64
import builtins
import json
import os
import select
import sys
import time
import types

MAX_DEPTH = 1000  # nesting of one value; deeper values are an error, not a crash
MAX_MESSAGE_BYTES = 64 << 20
MAX_ITEMS = 1 << 22  # values decoded from one message
MAX_INT_HEX_DIGITS = 1 << 16  # an int of 262,144 bits; 10**5000 needs 4,153 digits
MAX_FRACTION_HEX_DIGITS = 1 << 13  # normalising a Fraction costs a gcd, quadratic in its size
MAX_DECIMAL_CHARS = 1 << 13
MAX_SYNTHETIC_CLASSES = 256  # namedtuple and exception classes the judge makes for one test
MAX_COMPARED_OBJECTS = 1 << 17  # program objects one comparison of two program objects may walk
# A pipe round trip on a loaded machine: the judge gives the program this much wall time per request on top
# of the test's limit before it calls the test a timeout (the program's charged time is its CPU time).
ROUND_TRIP_ALLOWANCE_S = 0.002
MAX_ROUND_TRIP_ALLOWANCE_S = 30.0
# The program is charged its CPU time; on the wall clock (a program that sleeps or blocks) the judge waits this
# many times the limit, plus the allowance, before it calls the test a timeout, as a harness in the program's
# process would.
WALL_FACTOR = 1.0
PROGRESS_EVERY = 256
_READ_CHUNK = 1 << 16
_MUTABLE = (list, dict, set, bytearray)
_SCALARS = (int, float, str, bool, type(None))
# Modules a test may use besides the standard library, and the usual aliases of modules.
EXTRA_TRUSTED_MODULES = frozenset({"numpy", "pytest"})
MODULE_ALIASES = {"np": "numpy"}
# Standard-library modules that do something on import (open a browser, print) and are never a test's.
UNTRUSTED_MODULES = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "webbrowser"})
# Names datasets' tests use without importing them (MBPP keeps its imports in a field that assert-only
# datasets drop): the judge's own object, whatever the program bound to the name.
WELL_KNOWN = {
    "Fraction": ("fractions", "Fraction"),
    "Decimal": ("decimal", "Decimal"),
    "Counter": ("collections", "Counter"),
    "deque": ("collections", "deque"),
    "defaultdict": ("collections", "defaultdict"),
    "OrderedDict": ("collections", "OrderedDict"),
    "namedtuple": ("collections", "namedtuple"),
    "isclose": ("math", "isclose"),
    "pi": ("math", "pi"),
    "inf": ("math", "inf"),
    "approx": ("pytest", "approx"),
}
_DEFAULT_FACTORIES = {"int": int, "list": list, "set": set, "dict": dict, "str": str, "float": float}


class ProtocolError(Exception):
    """The program process sent something that is not a well-formed answer."""


class ProgramEnded(Exception):
    """The program process ended (exited, crashed, was killed) before answering."""


class ProgramTimeout(Exception):
    """The program did not answer within the test's time (plus the round-trip allowance)."""


class RemoteError(Exception):
    """The program raised an exception that is not a built-in one (its class stays in the program)."""


class Undecidable(BaseException):
    """A comparison the judge cannot decide on plain data (the order of two program objects, the equality of
    objects whose state no attribute shows): the test fails with status `error:Undecidable`. Not an `Exception`,
    so neither a test's `except Exception` nor `pytest.raises(TypeError)` turns the refusal into a pass."""


def trusted_module(name):
    """Whether the judge may import the module `name` itself."""
    if type(name) is not str or not name or len(name) > 200:
        return False
    top = name.partition(".")[0]
    if top in UNTRUSTED_MODULES or any(not part.isidentifier() for part in name.split(".")):
        return False
    return top in sys.stdlib_module_names or top in EXTRA_TRUSTED_MODULES


def _import(name):
    import importlib

    return importlib.import_module(name)


# --------------------------------------------------------------------------------------------------
# Values as tagged JSON. `handle_of(obj)` decides what a non-plain value becomes: the program registers it
# and sends a handle ("h"); the judge registers its own objects for the program to call back ("j"); each side
# sends the other's handles back as they came.


def encode(value, handle_of, depth=0):
    """`value` as tagged JSON; `handle_of(obj)` gives the tagged handle of what is not plain data."""
    if depth > MAX_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind is Remote or kind is JudgeObject:
        return handle_of(value)
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if issubclass(kind, int):
        return ["i", hex(int.__index__(value))]  # hex: no 4,300-digit limit, linear both ways
    if issubclass(kind, float):
        return ["f", float.hex(value)]
    if issubclass(kind, complex):
        number = complex.__complex__(value)
        return ["c", float.hex(number.real), float.hex(number.imag)]
    if issubclass(kind, str):
        return ["s", str.__str__(value)]
    if issubclass(kind, (bytes, bytearray)):
        tag = "Y" if issubclass(kind, bytearray) else "y"
        return [tag, base64.b64encode(bytes(memoryview(value))).decode()]
    if (kind is list or kind is tuple) and all(type(item) in _SCALARS for item in value):
        flat = _flat_json(value)  # the common case, a long list of numbers or strings, at C speed
        if flat is not None:
            return ["L" if kind is list else "T", flat]
    typed = _typed_container(value, kind, handle_of, depth)
    if typed is not None:
        return typed
    for base, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
        if issubclass(kind, base):
            return [tag, [encode(item, handle_of, depth + 1) for item in base.__iter__(value)]]
    if issubclass(kind, dict):
        return ["d", _pairs(value, handle_of, depth)]
    if isinstance(value, types.ModuleType) and trusted_module(value.__name__):
        return ["m", str(value.__name__)]  # the judge imports its own copy
    numbers = _exact_number(value, handle_of, depth)
    if numbers is not None:
        return numbers
    if isinstance(value, type) and issubclass(value, BaseException):
        return ["E", str(type.__getattribute__(value, "__name__")), _builtin_base(value)]
    origin = _origin(value)
    if origin is not None:
        return ["o", *origin]
    return handle_of(value)


def _pairs(value, handle_of, depth):
    return [[encode(k, handle_of, depth + 1), encode(v, handle_of, depth + 1)] for k, v in dict.items(value)]


def _typed_container(value, kind, handle_of, depth):
    """`collections` types keep their type: the judge rebuilds them with its own classes."""
    collections = sys.modules.get("collections")
    if collections is None:
        return None
    if issubclass(kind, tuple) and kind is not tuple and isinstance(getattr(kind, "_fields", None), tuple):
        fields = [str(f) for f in kind._fields]
        items = [encode(item, handle_of, depth + 1) for item in tuple.__iter__(value)]
        return ["N", str(type.__getattribute__(kind, "__name__")), fields, items]
    if issubclass(kind, collections.deque):
        items = [encode(item, handle_of, depth + 1) for item in collections.deque.__iter__(value)]
        return ["Q", items, value.maxlen if type(value.maxlen) is int else None]
    if issubclass(kind, collections.Counter):
        return ["C", _pairs(value, handle_of, depth)]
    if issubclass(kind, collections.OrderedDict):
        return ["O", _pairs(value, handle_of, depth)]
    if issubclass(kind, collections.defaultdict):
        factory = value.default_factory
        name = next((n for n, f in _DEFAULT_FACTORIES.items() if factory is f), None)
        return ["DD", name, _pairs(value, handle_of, depth)]
    return None


def _builtin_base(exc_class):
    for klass in type.__getattribute__(exc_class, "__mro__"):
        if klass.__module__ == "builtins" and klass.__name__ in _BUILTIN_EXCEPTIONS:
            return klass.__name__
    return "Exception"


_BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)


def _origin(value):
    """(module, qualified name) of a function, class or constant taken from a trusted module, or None."""
    try:
        module, qualname = value.__module__, value.__qualname__
    except Exception:
        return None
    if type(module) is not str or type(qualname) is not str or not trusted_module(module):
        return None
    parts = qualname.split(".")
    if len(parts) > 4 or any(not p.isidentifier() or p.startswith("__") for p in parts):
        return None
    found = sys.modules.get(module)
    for part in parts:
        found = getattr(found, part, None)
    return [module, qualname] if found is value else None


def _flat_json(items):
    """`items` (ints, floats, strings, bools, None) as one JSON text, or None where JSON would not carry them
    exactly (an int past the int-string limit)."""
    try:
        return json.dumps(items)
    except ValueError:
        return None


def _exact_number(value, handle_of, depth):
    """Fractions, decimals and numpy values compare with plain numbers as the test expects."""
    kind = type(value)
    fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
    if fractions is not None and issubclass(kind, fractions.Fraction):
        return ["q", hex(int.__index__(value.numerator)), hex(int.__index__(value.denominator))]
    if decimal is not None and issubclass(kind, decimal.Decimal):
        return ["D", decimal.Decimal.__str__(value)]
    numpy = sys.modules.get("numpy")
    if numpy is not None and issubclass(kind, numpy.ndarray) and value.dtype.kind in "biufc":
        flat = encode(value.ravel().tolist(), handle_of, depth + 1)
        return ["A", str(value.dtype.str), [int(n) for n in value.shape], flat]
    if kind.__module__ == "numpy" and hasattr(value, "tolist"):
        return encode(value.tolist(), handle_of, depth + 1)
    return None


class _Decoder:
    """The inverse of `encode`, for one message: it counts what it builds, so a hostile message costs the
    judge at most `MAX_ITEMS` values."""

    def __init__(self, remote, classes):
        self.remote, self.classes, self.items = remote, classes, 0

    def value(self, data, depth=0):
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise ProtocolError("value too deep or too large")
        if type(data) is not list or not data or type(data[0]) is not str:
            raise ProtocolError("malformed value")
        tag, rest = data[0], data[1:]
        simple = _SIMPLE.get(tag)
        if simple is not None:
            return simple(rest)
        if tag in ("L", "T"):
            items = json.loads(_text(rest[0]))
            if type(items) is not list or not all(type(item) in _SCALARS for item in items):
                raise ProtocolError("malformed flat list")
            self.items += len(items)
            return items if tag == "L" else tuple(items)
        if tag in ("l", "t", "S", "F"):
            items = [self.value(item, depth + 1) for item in _items(rest[0])]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d":
            return dict(self.pairs(rest[0], depth))
        if tag in ("C", "O", "DD", "Q", "N"):
            return self.collection(tag, rest, depth)
        if tag == "A":
            return self.array(rest, depth)
        if tag == "m" and trusted_module(rest[0]):
            return _import(rest[0])
        if tag == "o":
            return _trusted_object(_text(rest[0]), _text(rest[1]))
        if tag == "E":
            return self.exception_class(_text(rest[0]), _text(rest[1]))
        if tag in ("h", "j") and type(rest[0]) is int:
            return self.remote(tag, rest[0])
        raise ProtocolError(f"malformed value with tag {tag!r}")

    def pairs(self, data, depth):
        return [(self.value(k, depth + 1), self.value(v, depth + 1)) for k, v in _items(data)]

    def collection(self, tag, rest, depth):
        import collections

        if tag == "C":
            return collections.Counter(dict(self.pairs(rest[0], depth)))
        if tag == "O":
            return collections.OrderedDict(self.pairs(rest[0], depth))
        if tag == "DD":
            factory = _DEFAULT_FACTORIES[rest[0]] if rest[0] is not None else None
            return collections.defaultdict(factory, self.pairs(rest[1], depth))
        if tag == "Q":
            if rest[1] is not None and type(rest[1]) is not int:
                raise ProtocolError("malformed deque")
            return collections.deque([self.value(item, depth + 1) for item in _items(rest[0])], rest[1])
        name, fields = _text(rest[0]), tuple(_text(f) for f in _items(rest[1]))
        items = [self.value(item, depth + 1) for item in _items(rest[2])]
        return self.named_tuple(name, fields)(*items)

    def named_tuple(self, name, fields):
        key = ("N", name, fields)
        if key not in self.classes:
            if len(self.classes) >= MAX_SYNTHETIC_CLASSES or len(fields) > 256:
                raise ProtocolError("too many namedtuple classes")
            import collections

            self.classes[key] = collections.namedtuple(name, fields)
        return self.classes[key]

    def exception_class(self, name, base):
        builtin = getattr(builtins, base, None) if base in _BUILTIN_EXCEPTIONS else None
        if builtin is None:
            raise ProtocolError("malformed exception class")
        if name == base:
            return builtin
        key = ("E", name, base)
        if key not in self.classes:
            if len(self.classes) >= MAX_SYNTHETIC_CLASSES or not name.isidentifier():
                raise ProtocolError("malformed exception class")
            # The program's class, seen from the judge: caught by its built-in base (`except ValueError`) and by
            # the name the test reads from the program (`except InvalidInput`).
            plain = not issubclass(builtin, Exception) or builtin is Exception
            bases = (RemoteError,) if plain else (builtin, RemoteError)
            try:
                self.classes[key] = type(name, bases, {"__module__": "solution"})
            except TypeError:  # a base whose layout does not combine
                self.classes[key] = type(name, (RemoteError,), {"__module__": "solution"})
        return self.classes[key]

    def array(self, rest, depth):
        import math

        numpy = _import("numpy")
        dtype = numpy.dtype(_text(rest[0]))
        shape = tuple(int(n) for n in _items(rest[1]) if type(n) is int and n >= 0)
        flat = self.value(rest[2], depth + 1)
        if dtype.kind not in "biufc" or len(shape) != len(rest[1]) or type(flat) is not list:
            raise ProtocolError("malformed array")
        if math.prod(shape) != len(flat):
            raise ProtocolError("malformed array shape")
        return numpy.array(flat, dtype=dtype).reshape(shape)


def _int(rest):
    text = _text(rest[0])
    if len(text) > MAX_INT_HEX_DIGITS + 3:
        raise ProtocolError(f"an int of more than {MAX_INT_HEX_DIGITS} hex digits")
    return int(text, 16)


def _fraction(rest):
    import fractions

    if max(len(_text(rest[0])), len(_text(rest[1]))) > MAX_FRACTION_HEX_DIGITS + 3:
        raise ProtocolError(f"a fraction of more than {MAX_FRACTION_HEX_DIGITS} hex digits")
    return fractions.Fraction(int(rest[0], 16), int(rest[1], 16))


def _decimal(rest):
    import decimal

    if len(_text(rest[0])) > MAX_DECIMAL_CHARS:
        raise ProtocolError("a decimal too long")
    return decimal.Decimal(rest[0])


def _bytes(tag):
    def decode_bytes(rest):
        raw = base64.b64decode(_text(rest[0]), validate=True)
        return bytearray(raw) if tag == "Y" else raw

    return decode_bytes


def _bool(rest):
    if type(rest[0]) is not bool:
        raise ProtocolError("malformed bool")
    return rest[0]


_SIMPLE = {
    "n": lambda rest: None,
    "b": _bool,
    "i": _int,
    "f": lambda rest: float.fromhex(_text(rest[0])),
    "c": lambda rest: complex(float.fromhex(_text(rest[0])), float.fromhex(_text(rest[1]))),
    "s": lambda rest: _text(rest[0]),
    "y": _bytes("y"),
    "Y": _bytes("Y"),
    "q": _fraction,
    "D": _decimal,
}


def _trusted_object(module, qualname):
    """The judge's own `module.qualname`; refused unless the module is a trusted one."""
    parts = qualname.split(".")
    if not trusted_module(module) or len(parts) > 4 or any(not p.isidentifier() or p.startswith("_") for p in parts):
        raise ProtocolError("malformed origin")
    try:
        found = _import(module)
        for part in parts:
            found = getattr(found, part)
    except (ImportError, AttributeError):
        raise ProtocolError(f"no {module}.{qualname} here") from None
    return found


def decode(data, remote, classes=None):
    """The inverse of `encode`; `remote(tag, handle)` gives the object a handle stands for. Anything malformed
    is a `ProtocolError`, never another exception."""
    try:
        return _Decoder(remote, {} if classes is None else classes).value(data)
    except ProtocolError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, OverflowError, RecursionError, ArithmeticError) as e:
        raise ProtocolError(f"malformed value: {type(e).__name__}: {e}") from None


def _text(item):
    if type(item) is not str:
        raise ProtocolError("malformed value")
    return item


def _items(item):
    if type(item) is not list:
        raise ProtocolError("malformed value")
    return item


# --------------------------------------------------------------------------------------------------
# Messages: one JSON object per line.


class Channel:
    def __init__(self, read_fd, write_fd):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.buffer = bytearray()

    def send(self, message):
        data = memoryview((json.dumps(message) + "\n").encode())
        while data:
            data = data[os.write(self.write_fd, data) :]

    def receive(self, deadline=None):
        """The next message, or None at end of stream; `ProgramTimeout` past `deadline` (monotonic)."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"message over {MAX_MESSAGE_BYTES} bytes")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                    raise ProgramTimeout("the program did not answer in time")
            chunk = os.read(self.read_fd, _READ_CHUNK)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ProtocolError(f"malformed message: {e}") from None
        if type(message) is not dict:
            raise ProtocolError("malformed message")
        return message


class Peer:
    """One end of the channel. Both ends ask and answer: the judge asks the program to call its functions, and
    while it waits the program may ask the judge to call back a function the test passed to it. `objects` are
    this end's objects the other end holds handles to; `ops` what the other end may ask of them."""

    def __init__(self, channel, ops, handle_tag):
        self.channel, self.ops, self.handle_tag = channel, ops, handle_tag
        self.objects = {}
        self.classes = {}
        self.deadline = None  # the judge's: when its program has used up its time

    def handle_of(self, obj):
        key = id(obj)
        self.objects[key] = obj
        return [self.handle_tag, key]

    def encode(self, value):
        return encode(value, self.handle_of)

    def request(self, op, **fields):
        """Send a request and wait for its answer, serving the other end's requests meanwhile."""
        try:
            self.channel.send({"op": op, **fields})
            while True:
                message = self.channel.receive(self.deadline)
                if message is None:
                    raise ProgramEnded("the other end ended before answering")
                if "op" in message:
                    self.answer(message)
                    continue
                break
        except (BrokenPipeError, ConnectionError):
            raise ProgramEnded("the other end ended before answering") from None
        if message.get("ok") is True:
            return message
        raise self.exception_from(message, op)

    def answer(self, message):
        try:
            operation = self.ops[message["op"]]
            reply = {"ok": True, **operation(self, message)}
        except (ProgramEnded, ProgramTimeout, ProtocolError):
            raise
        except BaseException as e:  # the called code's exception is the asker's business: send it back
            reply = {"ok": False, "error": _exception_name(e), "base": _base_name(e), "message": _describe(e)}
        self.channel.send(reply)

    def serve(self):
        """Answer requests until the other end hangs up (the program's side)."""
        while True:
            try:
                message = self.channel.receive()
            except ProtocolError:
                return
            if message is None:
                return
            if "op" in message:
                self.answer(message)

    def target(self, message, key="target"):
        return self.objects[message[key]]

    def value(self, data):
        return decode(data, self.remote, self.classes)

    def remote(self, tag, handle):
        raise NotImplementedError

    def exception_from(self, reply, op):
        name, message = reply.get("error"), str(reply.get("message", ""))[:2000]
        if name == "StopIteration":
            # Only the end of a `next()`: anywhere else it would end the test's loop (`all(map(...))`) early.
            return StopIteration() if op == "next" else RemoteError("StopIteration raised by the program")
        if type(name) is not str or not name.isidentifier():
            return RemoteError(f"{name!r}: {message}")
        base = reply.get("base")
        base = base if type(base) is str and base in _BUILTIN_EXCEPTIONS else "Exception"
        try:
            kind = _Decoder(None, self.classes).exception_class(name, base)
        except ProtocolError:
            kind = RemoteError
        if not issubclass(kind, Exception) or kind is StopIteration:
            kind = RemoteError
        try:
            return kind(message)
        except Exception:
            return RemoteError(f"{name}: {message}")


def _base_name(exc):
    try:
        return _builtin_base(type(exc))
    except BaseException:
        return "Exception"


def _exception_name(exc):
    try:
        return str(type(exc).__name__)
    except BaseException:
        return "Exception"


def _describe(exc):
    try:
        return str(exc)[:2000]
    except BaseException:
        return ""


# --------------------------------------------------------------------------------------------------
# The program's side: run the program, then answer requests until the judge hangs up.


class JudgeObject:
    """A function or object of the test, seen from the program: each use is a request to the judge."""

    __slots__ = ("__weakref__", "_handle", "_peer")

    def __init__(self, peer, handle):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_handle", handle)

    def _ask(self, op, **fields):
        peer = object.__getattribute__(self, "_peer")
        reply = peer.request(op, target=object.__getattribute__(self, "_handle"), **fields)
        return peer.value(reply["value"])

    def __call__(self, *args, **kwargs):
        peer = object.__getattribute__(self, "_peer")
        kwargs = {k: peer.encode(v) for k, v in kwargs.items()}
        return self._ask("call", args=[peer.encode(a) for a in args], kwargs=kwargs)

    def __getattr__(self, name):
        if name.startswith("_"):  # the judge answers for public attributes only
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, value=object.__getattribute__(self, "_peer").encode(value))

    def __getitem__(self, key):
        return self._ask("getitem", key=object.__getattribute__(self, "_peer").encode(key))

    def __iter__(self):
        iterator = self._ask("iter")
        if type(iterator) is not JudgeObject:
            yield from iterator
            return
        while True:
            try:
                yield iterator._ask("next")
            except StopIteration:
                return

    def __next__(self):
        return self._ask("next")

    def __len__(self):
        return self._ask("len")

    def __bool__(self):
        return self._ask("bool") is True

    def __repr__(self):
        return str(self._ask("repr"))


class ProgramPeer(Peer):
    def __init__(self, channel, namespace):
        super().__init__(channel, PROGRAM_OPS, "h")
        self.namespace = namespace
        self.proxies = {}

    def remote(self, tag, handle):
        if tag == "h":
            return self.objects[handle]
        if handle not in self.proxies:  # one proxy per judge object, so `is` holds between them
            self.proxies[handle] = JudgeObject(self, handle)
        return self.proxies[handle]

    def encode(self, value):
        return encode(value, self._handle_of_program)

    def _handle_of_program(self, obj):
        if type(obj) is JudgeObject:  # the judge's own object goes back as the judge's handle
            return ["j", object.__getattribute__(obj, "_handle")]
        return self.handle_of(obj)


def _changed(peer, before, now):
    """`now` encoded if the call changed a mutable argument, else None (unchanged ones are not sent back)."""
    if type(now) not in _MUTABLE:
        return None
    encoded = peer.encode(now)
    return None if encoded == before else encoded


def _call(peer, message):
    args = [peer.value(a) for a in message["args"]]
    kwargs = {k: peer.value(v) for k, v in message["kwargs"].items()}
    result = peer.target(message)(*args, **kwargs)
    after = [_changed(peer, before, now) for before, now in zip(message["args"], args)]
    kwargs_after = {k: _changed(peer, message["kwargs"][k], v) for k, v in kwargs.items()}
    kwargs_after = {k: v for k, v in kwargs_after.items() if v is not None}
    return {"value": peer.encode(result), "args_after": after, "kwargs_after": kwargs_after}


def _truth(peer, message):
    """True where the object keeps the default truth of an object (no `__bool__`, no `__len__`): what a
    program's own truth would decide is refused."""
    kind = type(peer.target(message))
    default = all(getattr(k, "__bool__", None) is None and "__len__" not in vars(k) for k in kind.__mro__[:-1])
    if not default:
        raise TypeError(f"the truth of a {kind.__name__} is the program's own")
    return {"value": ["b", True]}


def _read_file(peer, message):
    with open(message["path"], "rb") as f:
        return {"value": ["y", base64.b64encode(f.read(MAX_MESSAGE_BYTES // 2)).decode()]}


def _value_op(get):
    return lambda peer, message: {"value": peer.encode(get(peer, message))}


def _no_private(name):
    if type(name) is not str or name.startswith("_"):
        raise AttributeError(f"{name!r}: only public attributes cross to the other process")
    return name


def _state(peer, message):
    """Two program objects the judge compares, and every program object their attributes reach, as data:
    [handle, class id, class name, "identity" | "data" | "opaque", [[attribute, value], ...] or None]. The judge
    compares them; the program's `__eq__` never runs. An object whose class keeps object's equality compares by
    identity, as in-process; one whose state lies past its attributes (a class derived from `datetime.date`)
    is opaque."""
    todo = [peer.target(message), peer.target(message, "other")]
    seen, states = set(), []

    def handle_of(obj):
        tagged = peer._handle_of_program(obj)
        if tagged[0] == "h" and tagged[1] not in seen:
            todo.append(obj)
        return tagged

    while todo:
        obj = todo.pop()
        handle = peer.handle_of(obj)[1]
        if handle in seen:
            continue
        if len(states) >= MAX_COMPARED_OBJECTS:
            return {"states": states}  # the judge refuses a comparison that needs one left out
        seen.add(handle)
        kind = type(obj)
        row = [handle, id(kind), str(type.__getattribute__(kind, "__qualname__"))[:200]]
        if kind.__eq__ is object.__eq__:
            states.append([*row, "identity", None])
            continue
        attributes = _attributes(obj)
        if attributes is None:
            states.append([*row, "opaque", None])
        else:
            states.append([*row, "data", [[name, encode(v, handle_of)] for name, v in attributes.items()]])
    return {"states": states}


def _attributes(obj):
    """{name: value} of the object's `__dict__` and `__slots__`, or None where it keeps state elsewhere."""
    kind = type(obj)
    if not _python_layout(kind):
        return None
    found = {}
    try:
        own = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        own = {}
    if type(own) is not dict:
        return None
    found.update((name, value) for name, value in own.items() if type(name) is str)
    for klass in kind.__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if type(name) is not str or name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"  # the mangled name the slot is stored under
            try:
                found[name] = object.__getattribute__(obj, name)
            except AttributeError:  # a slot never set
                continue
    return found


def _python_layout(kind):
    """Whether every field of an instance is a Python attribute (its `__dict__` or `__slots__`): walking the
    layout's bases, each adds nothing but slots, a dict or weak references to the one below, down to object."""
    while kind is not object:
        base = kind.__base__
        if base is None or kind.__itemsize__:
            return False
        if kind.__basicsize__ != base.__basicsize__ and "__slots__" not in vars(kind):
            adds_dict = kind.__dictoffset__ and not base.__dictoffset__
            adds_weakref = kind.__weakrefoffset__ and not base.__weakrefoffset__
            if not (adds_dict or adds_weakref):
                return False  # a C type's own fields (date's year, month, day)
        kind = base
    return True


PROGRAM_OPS = {
    "resolve": lambda p, m: {"values": {n: p.encode(p.namespace[n]) for n in m["names"] if n in p.namespace}},
    "call": _call,
    "getattr": _value_op(lambda p, m: getattr(p.target(m), m["name"])),
    "setattr": _value_op(lambda p, m: setattr(p.target(m), m["name"], p.value(m["value"]))),
    "getitem": _value_op(lambda p, m: p.target(m)[p.value(m["key"])]),
    "setitem": _value_op(lambda p, m: p.target(m).__setitem__(p.value(m["key"]), p.value(m["value"]))),
    "iter": _value_op(lambda p, m: iter(p.target(m))),
    "next": _value_op(lambda p, m: next(p.target(m))),
    "len": _value_op(lambda p, m: len(p.target(m))),
    "truth": _truth,
    "str": _value_op(lambda p, m: str(p.target(m))),
    "repr": _value_op(lambda p, m: repr(p.target(m))),
    "state": _state,
    "read_file": _read_file,
}


def serve(namespace, channel):
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * MAX_DEPTH + 500))
    ProgramPeer(channel, namespace).serve()


# --------------------------------------------------------------------------------------------------
# The judge's side: the test, with the program's names standing for handles.


class Link(Peer):
    """The judge's end of the channel; it counts the time spent waiting for the program (less the time it
    spent serving the program's calls back) and the requests it made."""

    def __init__(self, channel):
        super().__init__(channel, JUDGE_OPS, "j")
        self.waited = 0.0
        self.requests = 0
        self.limit = None  # seconds of waiting the program may use, before its round-trip allowance
        self.progress = None  # (requests, set-up seconds): called after set-up and every PROGRESS_EVERY requests

    def request(self, op, **fields):
        self.requests += 1
        if self.progress is not None and self.requests % PROGRESS_EVERY == 0:
            self.progress(self.requests, None)
        if self.limit is not None:
            allowance = min(self.requests * ROUND_TRIP_ALLOWANCE_S, MAX_ROUND_TRIP_ALLOWANCE_S)
            wall = WALL_FACTOR * self.limit + allowance
            self.deadline = time.monotonic() + max(0.0, wall - self.waited)
        started = time.perf_counter()
        try:
            return super().request(op, **fields)
        finally:
            self.waited += time.perf_counter() - started

    def answer(self, message):
        started = time.perf_counter()
        try:
            super().answer(message)
        finally:
            self.waited -= time.perf_counter() - started  # the test's own code, not the program's

    def remote(self, tag, handle):
        if tag == "j":
            if handle not in self.objects:
                raise ProtocolError("a handle the judge never gave out")
            return self.objects[handle]
        return Remote(self, handle)

    def encode(self, value):
        return encode(value, self._handle_of_judge)

    def _handle_of_judge(self, value):
        if type(value) is Remote:
            return ["h", object.__getattribute__(value, "_handle")]
        return self.handle_of(value)


def _judge_call(peer, message):
    args = [peer.value(a) for a in message["args"]]
    result = peer.target(message)(*args, **{k: peer.value(v) for k, v in message["kwargs"].items()})
    return {"value": peer.encode(result)}


JUDGE_OPS = {
    "call": _judge_call,
    "getattr": _value_op(lambda p, m: getattr(p.target(m), _no_private(m["name"]))),
    "setattr": _value_op(lambda p, m: setattr(p.target(m), _no_private(m["name"]), p.value(m["value"]))),
    "getitem": _value_op(lambda p, m: p.target(m)[p.value(m["key"])]),
    "iter": _value_op(lambda p, m: iter(p.target(m))),
    "next": _value_op(lambda p, m: next(p.target(m))),
    "len": _value_op(lambda p, m: len(p.target(m))),
    "bool": _value_op(lambda p, m: bool(p.target(m))),
    "repr": _value_op(lambda p, m: repr(p.target(m))),
}


def _sync(original, new):
    """Make `original` (an argument the test passed) equal to `new` (its state after the call), in place."""
    if type(original) is not type(new):
        return
    if type(original) is list:
        if len(original) == len(new):
            for i, (old_item, new_item) in enumerate(zip(original, new)):
                if type(old_item) in _MUTABLE and type(old_item) is type(new_item):
                    _sync(old_item, new_item)
                else:
                    original[i] = new_item
        else:
            original[:] = new
    elif type(original) in (dict, set):
        original.clear()
        original.update(new)
    else:
        original[:] = new


_NOT_PLAIN = (
    "the program gave an object that is not plain data (a number, string, bytes, list, tuple, dict or set), and it "
    "cannot be compared with the test's value"
)


class Remote:
    """A program object seen from the judge. It never decides a verdict on the program's word: comparing it
    with plain data, hashing it, ordering it and a truth of its own are `Undecidable` (no `except` in a test turns
    the refusal into a pass), and two program objects compare on their data, here (`_same_program_objects`)."""

    __slots__ = ("_handle", "_link")

    def __init__(self, link, handle):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_handle", handle)

    def _ask(self, op, **fields):
        link = object.__getattribute__(self, "_link")
        reply = link.request(op, target=object.__getattribute__(self, "_handle"), **fields)
        return link.value(reply["value"])

    def __call__(self, *args, **kwargs):
        link = object.__getattribute__(self, "_link")
        link_args = [link.encode(a) for a in args]
        link_kwargs = {k: link.encode(v) for k, v in kwargs.items()}
        handle = object.__getattribute__(self, "_handle")
        reply = link.request("call", target=handle, args=link_args, kwargs=link_kwargs)
        for original, after in zip(args, reply.get("args_after") or []):
            if after is not None and type(original) in _MUTABLE:
                _sync(original, link.value(after))
        for key, after in (reply.get("kwargs_after") or {}).items():
            if key in kwargs and type(kwargs[key]) in _MUTABLE:
                _sync(kwargs[key], link.value(after))
        return link.value(reply["value"])

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, value=object.__getattribute__(self, "_link").encode(value))

    def __getitem__(self, key):
        return self._ask("getitem", key=object.__getattribute__(self, "_link").encode(key))

    def __setitem__(self, key, value):
        link = object.__getattribute__(self, "_link")
        self._ask("setitem", key=link.encode(key), value=link.encode(value))

    def __iter__(self):
        iterator = self._ask("iter")
        if type(iterator) is not Remote:
            yield from iterator
            return
        while True:
            try:
                item = iterator._ask("next")
            except StopIteration:
                return
            yield item

    def __next__(self):
        return self._ask("next")

    def _plain(self, op, kind):
        result = self._ask(op)
        if type(result) is not kind:
            raise TypeError(f"the program's {op}() gave a {type(result).__name__}")
        return result

    def __len__(self):
        return self._plain("len", int)

    def __bool__(self):
        try:
            truth = self._ask("truth")
        except TypeError as error:  # the object's truth is its own __bool__/__len__
            raise Undecidable(str(error)) from None
        if truth is not True:
            raise Undecidable("the truth of a program object is the program's own")
        return True

    def __str__(self):
        return self._plain("str", str)

    def __repr__(self):
        return self._plain("repr", str)

    def __contains__(self, item):
        # Membership is decided here, on what iterating the object gives: never by the program's __contains__.
        for element in self:
            if type(element) is Remote and type(item) is not Remote:
                raise Undecidable(_NOT_PLAIN)
            if element is item or element == item:
                return True
        return False

    def __eq__(self, other):
        if type(other) is not Remote:
            raise Undecidable(_NOT_PLAIN)
        return _same_program_objects(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def _unordered(self, other):
        raise Undecidable("the order of program objects is their own __lt__: the judge cannot decide it")

    __lt__ = __le__ = __gt__ = __ge__ = _unordered

    def __hash__(self):
        raise Undecidable("a program object has no hash the judge can use")


def _handle(remote):
    return object.__getattribute__(remote, "_handle")


class _State:
    __slots__ = ("attributes", "equality", "kind", "name")

    def __init__(self, kind, name, equality, attributes):
        self.kind, self.name, self.equality, self.attributes = kind, name, equality, attributes


def _same_program_objects(left, right):
    """`left == right` for two program objects, decided here on their data (the program's `__eq__` never
    runs): objects of one class that defines `__eq__` are equal where their attributes are, compared as plain
    data, or, for program objects among them, the same way (a linked list, a tree; cycles end as equal);
    objects of a class that keeps object's equality only where they are the same object. Where the state is
    not all in attributes, or the objects are too many, the test fails (`Undecidable`), never passes."""
    if _handle(left) == _handle(right):
        return True
    link = object.__getattribute__(left, "_link")
    states = _decode_states(link, link.request("state", target=_handle(left), other=_handle(right)))
    pairs, assumed = [(left, right)], set()
    while pairs:
        a, b = pairs.pop()
        if type(a) is Remote or type(b) is Remote:
            if type(a) is not Remote or type(b) is not Remote:
                return False  # a program object is no plain value: both come from the program here
            key = (_handle(a), _handle(b))
            if key[0] == key[1] or key in assumed:
                continue
            assumed.add(key)
            first, second = states.get(key[0]), states.get(key[1])
            if first is None or second is None:
                raise Undecidable(f"program objects too many to compare (over {MAX_COMPARED_OBJECTS})")
            if first.kind != second.kind or "identity" in (first.equality, second.equality):
                return False
            if first.attributes is None or second.attributes is None:
                raise Undecidable(f"a {first.name} keeps its state past its attributes: only its own __eq__ sees it")
            if first.attributes.keys() != second.attributes.keys():
                return False
            pairs.extend((first.attributes[k], second.attributes[k]) for k in first.attributes)
        elif type(a) is type(b) and isinstance(a, _sequences()):
            if len(a) != len(b):
                return False
            pairs.extend(zip(a, b))
        elif type(a) is type(b) and isinstance(a, dict):
            if a.keys() != b.keys():
                return False
            pairs.extend((a[k], b[k]) for k in a)
        elif not _plain_equal(a, b):
            return False
    return True


def _sequences():
    collections = sys.modules.get("collections")
    return (list, tuple) if collections is None else (list, tuple, collections.deque)


def _plain_equal(a, b):
    numpy = sys.modules.get("numpy")
    if numpy is not None and (isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray)):
        return bool(numpy.array_equal(a, b))
    return bool(a == b)


def _decode_states(link, reply):
    """{handle: _State} from the program's `state` answer; malformed rows are a `ProtocolError`."""
    rows = reply.get("states")
    if type(rows) is not list:
        raise ProtocolError("malformed state answer")
    states = {}
    for row in rows:
        if type(row) is not list or len(row) != 5:
            raise ProtocolError("malformed state answer")
        handle, kind, name, equality, attributes = row
        if type(handle) is not int or type(kind) is not int or type(name) is not str:
            raise ProtocolError("malformed state answer")
        if equality not in ("identity", "data", "opaque") or (equality == "data") != (attributes is not None):
            raise ProtocolError("malformed state answer")
        if attributes is not None:
            attributes = {_text(pair[0]): link.value(pair[1]) for pair in map(_pair, _items(attributes))}
        states[handle] = _State(kind, name[:200], equality, attributes)
    return states


def _pair(item):
    if type(item) is not list or len(item) != 2:
        raise ProtocolError("malformed value")
    return item


# --------------------------------------------------------------------------------------------------
# Which names the judge answers itself.


def test_names(tree):
    """(names the test reads, names the test binds itself, names whose attributes it reads)."""
    import ast

    read, bound, dotted = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            dotted.add(node.value.id)
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - set(dir(builtins)), bound, dotted


def program_imports(program_source):
    """What the program's source imports at module level: ({name: (module, attribute or None)}, [star modules]),
    from trusted modules only. Parsed, never run."""
    import ast

    try:
        tree = ast.parse(program_source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}, []
    names, stars, todo = {}, [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.partition(".")[0]
                    names[top] = (top, None)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name == "*":
                    stars.append(node.module)
                else:
                    names[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
    return {n: m for n, m in names.items() if trusted_module(m[0])}, [m for m in stars if trusted_module(m)]


def trusted_names(names, program_source, dotted=frozenset()):
    """{name: the judge's own object} for every name in `names` that is a module or taken from one. A module's
    name counts as one where the test reads its attributes (`math.pi`), or the program imports it: a test that
    calls `copy(x)` calls the program's function, not the module."""
    imported, stars = program_imports(program_source)
    own = {}
    for name in names:
        try:
            found = _trusted_binding(name, imported, stars, name in dotted)
        except (ImportError, AttributeError):
            continue  # not installed here: then the program cannot have it either
        if found is not _MISSING:
            own[name] = found
    return own


_MISSING = object()


def _trusted_binding(name, imported, stars, dotted):
    module = MODULE_ALIASES.get(name, name)
    if dotted and trusted_module(module) and "." not in module:
        import importlib.util

        if importlib.util.find_spec(module) is not None:
            return _import(module)
    if name in imported:
        module, attribute = imported[name]
        if attribute is None:
            return _import(module)
        found = _import(module)
        if hasattr(found, attribute):
            return getattr(found, attribute)
        return _import(f"{module}.{attribute}")
    for module in stars:
        found = _import(module)
        exported = getattr(found, "__all__", None)
        public = (name in exported) if isinstance(exported, (list, tuple)) else not name.startswith("_")
        if public and hasattr(found, name):
            return getattr(found, name)
    if name in WELL_KNOWN:
        module, attribute = WELL_KNOWN[name]
        return getattr(_import(module), attribute)
    return _MISSING


def _judge_open(link):
    """`open` for the test, reading only: a relative path is a file the program wrote, whose bytes the program
    sends (the program and the judge have separate work dirs); an absolute path is the judge's own."""
    import io

    def judge_open(file, mode="r", encoding=None, errors=None, newline=None, **_):
        if type(file) is not str or any(c in mode for c in "wax+"):
            raise PermissionError("a test may only read files")
        if os.path.isabs(file):
            return open(file, mode, encoding=encoding, errors=errors, newline=newline)
        data = link.value(link.request("read_file", path=file)["value"])
        if "b" in mode:
            return io.BytesIO(data)
        return io.TextIOWrapper(io.BytesIO(data), encoding=encoding or "utf-8", errors=errors, newline=newline)

    return judge_open


def judge(test_source, link, program_source="", limit=None):
    """Run the test against the program's names; raises what the test raises."""
    import ast

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * MAX_DEPTH + 500))
    started = time.perf_counter()
    tree = ast.parse(test_source, "<test>")
    code = compile(tree, "<test>", "exec")
    read, bound, dotted = test_names(tree)
    own = trusted_names(read - bound, program_source, dotted)
    if link.progress is not None:  # importing the judge's own numpy is not the test's time
        link.progress(0, time.perf_counter() - started)
    link.limit = limit
    asked = sorted(read - set(own))
    # Always asked, also for no names: the program must finish its top level before the test passes.
    values = link.request("resolve", names=asked).get("values")
    if type(values) is not dict:
        raise ProtocolError("malformed resolve answer")
    test_builtins = dict(vars(builtins))
    test_builtins["open"] = _judge_open(link)
    namespace = {"__name__": "__test__", "__builtins__": test_builtins}
    # Only the names asked for: an answer naming `all` or `len` must not replace the test's built-ins.
    namespace.update({name: link.value(values[name]) for name in asked if name in values})
    namespace.update(own)
    exec(code, namespace)

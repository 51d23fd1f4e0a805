"""Assert tests judged outside the program's process.

An assert test (`assert add(1, 2) == 3`, a HumanEval `check(candidate)`, loops, helper variables) runs in a
*judge* process that never executes a line of the program. Every name the test takes from the program is a
`Remote` handle there: calling it, reading its attributes or iterating it is a request over a pipe to the
*program* process, which runs the program, answers each request and sends back plain data only (ints,
floats, strings, bytes, lists, tuples, dicts, sets and nothing else, tagged by type). So:

* the test's expected values, and the comparison itself, never exist in the program's process: replacing
  `builtins.exec`, reading the caller's frame, `gc.get_objects()` or reporting "done" early cannot
  change the verdict, which the judge sends on its own status pipe;
* an object whose `==` is always true never reaches a comparison with the test's data: a value that is not
  plain data stays a handle in the judge, and comparing a handle with plain data is a `TypeError`;
* the program's time is measured by the judge, as the time it waits for the program's answers.

What the test asks the program's own objects (`len`, truth, iteration, comparing two program objects) is
answered by the program, as the test asked. Arguments are copied to the program, and a list, dict, set or
bytearray argument the program changed in place is changed the same way in the judge, so in-place tests
(`rotate(matrix); assert matrix == ...`) still hold.

Both runners load this file by path (it is stdlib only); neither has its directory on `sys.path`.
"""

import base64
import builtins
import json
import os
import sys
import time
import types

MAX_DEPTH = 100  # nesting of one value; deeper values are an error, not a crash
MAX_MESSAGE_BYTES = 64 << 20
_READ_CHUNK = 1 << 16
_MUTABLE = (list, dict, set, bytearray)
_SCALARS = (int, float, str, bool, type(None))


class ProtocolError(Exception):
    """The program process sent something that is not a well-formed answer."""


class ProgramEnded(Exception):
    """The program process ended (exited, crashed, was killed) before answering."""


class RemoteError(Exception):
    """The program raised an exception that is not a built-in one (its class stays in the program)."""


# --------------------------------------------------------------------------------------------------
# Values as tagged JSON. `handle_of(obj)` decides what a non-plain value becomes: the program registers it
# and sends a handle; the judge passes only its own `Remote` handles back and refuses anything else.


def encode(value, handle_of, depth=0):
    if depth > MAX_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
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
    for base, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
        if issubclass(kind, base):
            return [tag, [encode(item, handle_of, depth + 1) for item in base.__iter__(value)]]
    if issubclass(kind, dict):
        return ["d", [[encode(k, handle_of, depth + 1), encode(v, handle_of, depth + 1)] for k, v in dict.items(value)]]
    if isinstance(value, types.ModuleType) and _is_stdlib(value.__name__):
        return ["m", str(value.__name__)]  # the judge imports its own copy
    numbers = _exact_number(value, handle_of, depth)
    if numbers is not None:
        return numbers
    return ["h", handle_of(value)]


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
    if kind.__module__ == "numpy" and hasattr(value, "tolist"):
        return encode(value.tolist(), handle_of, depth + 1)
    return None


def decode(data, remote, depth=0):
    """The inverse of `encode`; `remote(handle)` gives the object a handle stands for. Anything malformed is a
    `ProtocolError`, never another exception."""
    try:
        return _decode(data, remote, depth)
    except ProtocolError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, OverflowError, RecursionError) as e:
        raise ProtocolError(f"malformed value: {type(e).__name__}: {e}") from None


def _decode(data, remote, depth):
    if depth > MAX_DEPTH or type(data) is not list or not data or type(data[0]) is not str:
        raise ProtocolError("malformed value")
    tag, rest = data[0], data[1:]
    if tag == "n":
        return None
    if tag == "b" and type(rest[0]) is bool:
        return rest[0]
    if tag == "i":
        return int(_text(rest[0]), 16)
    if tag == "f":
        return float.fromhex(_text(rest[0]))
    if tag == "c":
        return complex(float.fromhex(_text(rest[0])), float.fromhex(_text(rest[1])))
    if tag == "s":
        return _text(rest[0])
    if tag in ("y", "Y"):
        raw = base64.b64decode(_text(rest[0]), validate=True)
        return bytearray(raw) if tag == "Y" else raw
    if tag in ("L", "T"):
        items = json.loads(_text(rest[0]))
        if type(items) is not list or not all(type(item) in _SCALARS for item in items):
            raise ProtocolError("malformed flat list")
        return items if tag == "L" else tuple(items)
    if tag in ("l", "t", "S", "F"):
        items = [_decode(item, remote, depth + 1) for item in _items(rest[0])]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        return {_decode(k, remote, depth + 1): _decode(v, remote, depth + 1) for k, v in _items(rest[0])}
    if tag == "q":
        import fractions

        return fractions.Fraction(int(_text(rest[0]), 16), int(_text(rest[1]), 16))
    if tag == "D":
        import decimal

        return decimal.Decimal(_text(rest[0]))
    if tag == "m" and _is_stdlib(_text(rest[0])):
        import importlib

        return importlib.import_module(rest[0])
    if tag == "h" and type(rest[0]) is int:
        return remote(rest[0])
    raise ProtocolError(f"malformed value with tag {tag!r}")


def _is_stdlib(name):
    return type(name) is str and name.partition(".")[0] in sys.stdlib_module_names


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

    def receive(self):
        """The next message, or None at end of stream."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"message over {MAX_MESSAGE_BYTES} bytes")
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


# --------------------------------------------------------------------------------------------------
# The program's side: run the program, then answer requests until the judge hangs up.


def serve(namespace, channel):
    handles = {}

    def handle_of(obj):
        handles[id(obj)] = obj
        return id(obj)

    def obj(message, key="target"):
        return handles[message[key]]

    def plain(data):
        return decode(data, handles.__getitem__)

    def changed(before, now):
        """`now` encoded if the call changed a mutable argument, else None (unchanged ones are not sent back)."""
        if type(now) not in _MUTABLE:
            return None
        encoded = encode(now, handle_of)
        return None if encoded == before else encoded

    def call(message):
        args = [plain(a) for a in message["args"]]
        kwargs = {k: plain(v) for k, v in message["kwargs"].items()}
        result = obj(message)(*args, **kwargs)
        after = [changed(before, now) for before, now in zip(message["args"], args)]
        kwargs_after = {k: changed(message["kwargs"][k], v) for k, v in kwargs.items()}
        kwargs_after = {k: v for k, v in kwargs_after.items() if v is not None}
        return {"value": encode(result, handle_of), "args_after": after, "kwargs_after": kwargs_after}

    operations = {
        "resolve": lambda m: {"values": {n: encode(namespace[n], handle_of) for n in m["names"] if n in namespace}},
        "call": call,
        "getattr": lambda m: {"value": encode(getattr(obj(m), m["name"]), handle_of)},
        "getitem": lambda m: {"value": encode(obj(m)[plain(m["key"])], handle_of)},
        "iter": lambda m: {"value": encode(iter(obj(m)), handle_of)},
        "next": lambda m: {"value": encode(next(obj(m)), handle_of)},
        "len": lambda m: {"value": encode(len(obj(m)), handle_of)},
        "bool": lambda m: {"value": encode(bool(obj(m)), handle_of)},
        "str": lambda m: {"value": encode(str(obj(m)), handle_of)},
        "repr": lambda m: {"value": encode(repr(obj(m)), handle_of)},
        "contains": lambda m: {"value": encode(plain(m["item"]) in obj(m), handle_of)},
        "eq": lambda m: {"value": encode(bool(obj(m) == obj(m, "other")), handle_of)},
    }
    while True:
        try:
            message = channel.receive()
        except ProtocolError:
            return
        if message is None:
            return
        try:
            reply = {"ok": True, **operations[message["op"]](message)}
        except BaseException as e:  # the program's exception is the test's business: send it back
            reply = {"ok": False, "error": _exception_name(e), "message": _describe(e)}
        channel.send(reply)


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
# The judge's side: the test, with the program's names standing for handles.


class Link:
    """The judge's end of the channel; it counts the time spent waiting for the program."""

    def __init__(self, channel):
        self.channel = channel
        self.waited = 0.0

    def request(self, op, **fields):
        started = time.perf_counter()
        try:
            self.channel.send({"op": op, **fields})
            reply = self.channel.receive()
        except (BrokenPipeError, ConnectionError):
            reply = None
        finally:
            self.waited += time.perf_counter() - started
        if reply is None:
            raise ProgramEnded("the program ended before answering")
        if reply.get("ok") is True:
            return reply
        raise _exception_from(reply)

    def value(self, data):
        return decode(data, lambda handle: Remote(self, handle))

    def encode(self, value):
        return encode(value, _handle_of_remote)


def _handle_of_remote(value):
    if type(value) is Remote:
        return object.__getattribute__(value, "_handle")
    raise TypeError(f"a {type(value).__name__} cannot be passed to the program: only plain data can")


def _exception_from(reply):
    name, message = reply.get("error"), reply.get("message", "")
    if name == "StopIteration":
        return StopIteration()
    kind = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(kind, type) and issubclass(kind, Exception) and kind is not StopIteration:
        return kind(message)
    return RemoteError(f"{name}: {message}")


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


class Remote:
    """A program object seen from the judge. Comparing it with plain data is refused: that comparison is
    exactly what an always-equal object would forge."""

    __slots__ = ("_handle", "_link")

    def __init__(self, link, handle):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_handle", handle)

    def _ask(self, op, **fields):
        link = object.__getattribute__(self, "_link")
        reply = link.request(op, target=object.__getattribute__(self, "_handle"), **fields)
        return link, reply

    def __call__(self, *args, **kwargs):
        link = object.__getattribute__(self, "_link")
        link_args = [link.encode(a) for a in args]
        link_kwargs = {k: link.encode(v) for k, v in kwargs.items()}
        _, reply = self._ask("call", args=link_args, kwargs=link_kwargs)
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
        link, reply = self._ask("getattr", name=name)
        return link.value(reply["value"])

    def __getitem__(self, key):
        link = object.__getattribute__(self, "_link")
        _, reply = self._ask("getitem", key=link.encode(key))
        return link.value(reply["value"])

    def __iter__(self):
        link, reply = self._ask("iter")
        iterator = link.value(reply["value"])
        if type(iterator) is not Remote:
            yield from iterator
            return
        while True:
            try:
                item_link, item = iterator._ask("next")
            except StopIteration:
                return
            yield item_link.value(item["value"])

    def _plain(self, op, kind):
        link, reply = self._ask(op)
        result = link.value(reply["value"])
        if type(result) is not kind:
            raise TypeError(f"the program's {op}() gave a {type(result).__name__}")
        return result

    def __len__(self):
        return self._plain("len", int)

    def __bool__(self):
        return self._plain("bool", bool)

    def __str__(self):
        return self._plain("str", str)

    def __repr__(self):
        return self._plain("repr", str)

    def __contains__(self, item):
        link = object.__getattribute__(self, "_link")
        _, reply = self._ask("contains", item=link.encode(item))
        return link.value(reply["value"]) is True

    def __eq__(self, other):
        if type(other) is not Remote:
            raise TypeError(
                "the program gave an object that is not plain data (a number, string, bytes, list, tuple, dict "
                "or set), and it cannot be compared with the test's value"
            )
        link, reply = self._ask("eq", other=object.__getattribute__(other, "_handle"))
        return link.value(reply["value"]) is True

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__


def program_names(test_source):
    """Every name the test reads: the program answers for those it defines."""
    import ast

    tree = ast.parse(test_source, "<test>")
    return sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} - set(dir(builtins)))


def judge(test_source, link):
    """Run the test against the program's names; raises what the test raises."""
    code = compile(test_source, "<test>", "exec")
    names = program_names(test_source)
    values = link.request("resolve", names=names).get("values")
    if type(values) is not dict:
        raise ProtocolError("malformed resolve answer")
    namespace = {"__name__": "__test__", "__builtins__": builtins}
    # Only the names asked for: an answer naming `all` or `len` must not replace the test's built-ins.
    namespace.update({name: link.value(values[name]) for name in names if name in values})
    exec(code, namespace)

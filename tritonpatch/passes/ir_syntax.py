"""The syntax of one line of Triton's textual TTIR / TTGIR, as the mask rewrites read it.

Triton prints one operation per line; operations with regions (``scf.for``, ``scf.if``,
``tt.reduce``, ...) open a region with a line ending in ``{`` and close it with a line starting
with ``}``. :func:`parse_line` keeps the text of a line untouched (so unchanged code round-trips
byte for byte) and adds what the passes need of it: the values it defines, the values it uses, the
operation name, its operands and trailing location; :func:`parse_for` reads the head of an
``scf.for``, :func:`parse_type` a tensor type. How the lines nest into a module is :mod:`.ir`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

VALUE_NAME = r"%[A-Za-z0-9_$.\-]+"   # a value name in a pattern
VALUE_RE = re.compile(VALUE_NAME + r"(?:#\d+)?")
NAME_END = r"(?![A-Za-z0-9_$.\-])"   # after a value name in a pattern: the name ends there (``#k`` may follow)
_RESULTS_RE = re.compile(r"^(\s*)((?:" + VALUE_NAME + r"(?::\d+)?)(?:, " + VALUE_NAME + r"(?::\d+)?)*) = (.*)$")
_FOR_RE = re.compile(r"scf\.for (" + VALUE_NAME + r") = (" + VALUE_NAME + r") to (" + VALUE_NAME + r") step ("
                     + VALUE_NAME + r")(?: iter_args\((.*?)\) -> \((.*)\))?\s*: (\S+) \{$")
_TENSOR_RE = re.compile(r"^tensor<((?:\d+x)*)([^,>]+)(,.*)?>$")


def base_name(value: str) -> str:
    """``%acc#3`` -> ``%acc`` (the defining name of a use)."""
    return value.split("#", 1)[0]


def split_loc(text: str) -> tuple[str, str]:
    """Split ``"... loc(#loc12)"`` into ``("...", "loc(#loc12)")``; no location -> ``(text, "")``."""
    stripped = text.rstrip()
    if not stripped.endswith(")"):
        return text, ""
    depth = 0
    for pos in range(len(stripped) - 1, -1, -1):
        char = stripped[pos]
        if char == ")":
            depth += 1
        elif char == "(":
            depth -= 1
            if depth == 0:
                if stripped[pos - 3:pos] == "loc" and stripped[pos - 4:pos - 3] == " ":
                    return stripped[:pos - 4], stripped[pos - 3:]
                return text, ""
    return text, ""


@dataclass
class TensorType:
    """``tensor<128x64xi32, #mma>`` -> shape (128, 64), element ``i32``, encoding ``", #mma"``."""
    shape: tuple[int, ...]
    element: str
    encoding: str = ""

    def text(self, shape=None, element=None) -> str:
        dims = "".join(f"{d}x" for d in (self.shape if shape is None else shape))
        return f"tensor<{dims}{element or self.element}{self.encoding}>"


def parse_type(text: str):
    """A TensorType for ``tensor<...>`` text, else the scalar type string itself (``i32``)."""
    text = text.strip()
    match = _TENSOR_RE.match(text)
    if match:
        dims = tuple(int(d) for d in match.group(1).split("x") if d)
        return TensorType(dims, match.group(2), match.group(3) or "")
    return text


def int_width(type_text: str) -> int | None:
    """Bit width of an integer element / scalar type (``i32`` -> 32), None for other types."""
    element = type_text.element if isinstance(type_text, TensorType) else type_text
    if re.fullmatch(r"i\d+", element or ""):
        return int(element[1:])
    return None


@dataclass
class Line:
    """One line of IR: its text, and for operation lines the parsed head."""
    text: str
    indent: str = ""
    results: list[str] = field(default_factory=list)   # defined names, e.g. ["%acc"] for "%acc:5 = ..."
    values: int = 0                                    # how many values it defines (5 for "%acc:5 = ...")
    op: str = ""                                       # "arith.addi", "scf.for", "}" for closers
    body: str = ""                                     # text after the op name, without location
    loc: str = ""
    opens: bool = False
    closes: bool = False

    @property
    def operands(self) -> list[str]:
        """Values used on this line (in order of appearance)."""
        return VALUE_RE.findall(self.body)


def parse_line(text: str) -> Line:
    stripped = text.strip()
    line = Line(text, indent=text[:len(text) - len(text.lstrip())])
    line.opens = stripped.endswith("{")
    line.closes = stripped.startswith("}")
    head, line.loc = split_loc(stripped)
    match = _RESULTS_RE.match(head)
    rest = head
    if match:
        names = match.group(2).split(", ")
        line.results = [r.split(":")[0] for r in names]
        line.values = sum(int(r.split(":")[1]) if ":" in r else 1 for r in names)
        rest = match.group(3)
    if line.closes:
        line.op = "}"
        line.body = rest
        return line
    op, _, body = rest.partition(" ")
    if op.startswith('"'):
        op = op.split('"')[1]
        body = rest[len(op) + 2:]
    line.op, line.body = op, body
    return line


@dataclass
class ForLoop:
    """The parsed head of an ``scf.for`` line."""
    iv: str
    lower: str
    upper: str
    step: str
    iter_args: list[tuple[str, str]]   # (block argument, initial value)
    result_types: list[str]
    iv_type: str


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside <>, (), [], {} (types such as ``tensor<1x2xf32, #mma>``)."""
    parts, depth, start = [], 0, 0
    for pos, char in enumerate(text):
        if char in "<([{":
            depth += 1
        elif char in ">)]}":
            depth -= 1
        elif char == sep and depth == 0:
            parts.append(text[start:pos].strip())
            start = pos + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def parse_for(line: Line) -> ForLoop | None:
    head = line.text.strip()
    match = _FOR_RE.search(head)
    if not match:
        return None
    iv, lower, upper, step, args, types, iv_type = match.groups()
    iter_args = []
    for pair in split_top_level(args or ""):
        name, _, init = pair.partition(" = ")
        iter_args.append((name.strip(), init.strip()))
    return ForLoop(iv, lower, upper, step, iter_args, split_top_level(types or ""), iv_type)


def with_inits(head_text: str, loop: ForLoop, inits: list[str]) -> str:
    """The ``scf.for`` line ``head_text`` of ``loop`` with its iteration arguments starting at ``inits``
    (one per argument, in order)."""
    pairs = ", ".join(f"{arg} = {init}" for (arg, _), init in zip(loop.iter_args, inits))
    return re.sub(r"iter_args\(.*?\) -> ", lambda _: f"iter_args({pairs}) -> ", head_text, count=1)


def with_attribute(closing: str, attribute: str) -> str:
    """A region op's closing line (``} loc(...)`` or ``} {attrs} loc(...)``) with a unit attribute
    added to its attribute dictionary."""
    stripped = closing.lstrip()
    indent = closing[:len(closing) - len(stripped)]
    if stripped.startswith("} {"):
        return f"{indent}}} {{{attribute}, {stripped[3:]}"
    return f"{indent}}} {{{attribute}}}{stripped[1:]}"


def without_attribute(closing: str, attribute: str) -> str:
    """The inverse of :func:`with_attribute`: ``closing`` without the unit attribute, wherever it
    stands in the dictionary."""
    for written, rest in ((f" {{{attribute}}}", ""), (f"{{{attribute}, ", "{"), (f", {attribute}}}", "}"),
                          (f", {attribute}, ", ", ")):     # sole, first, last, in between
        if written in closing:
            return closing.replace(written, rest, 1)
    return closing

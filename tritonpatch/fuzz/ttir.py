"""A tiny evaluator of TTIR scalar arithmetic, for the fuzzer's static loop-bounds check.

It reads a kernel's TTIR text, evaluates the function-level scalar integer ops (``arith.*`` on
``i1`` / ``i32`` / ``i64``, constants, program ids) for given argument values and program ids, and
reports each top-level ``scf.for`` as ``(source line, lower, upper, step, iv width)``. Written
from MLIR's op semantics, independently of :mod:`tritonpatch.passes` (whose bound arithmetic it
checks): wrapping two's-complement arithmetic, truncating division, signed and unsigned compares.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"%[A-Za-z0-9_$.\-]+"
_DEF = re.compile(r"^\s*(" + _NAME + r")(?::\d+)? = ([a-z_]+\.[a-z_.]+)\s*(.*?)\s*(?:loc\(.*\))?$")
_FOR = re.compile(r"scf\.for (" + _NAME + r") = (" + _NAME + r") to (" + _NAME + r") step (" + _NAME + r")"
                  r".*: (i\d+) \{$")
_ARG = re.compile(r"(" + _NAME + r"): ([^\s,{)]+(?:<[^>]*>)?)")
_LOC_REF = re.compile(r"loc\((#loc\d*)\)\s*$")
_LOC_DEF = re.compile(r"^(#loc\d*) = loc\((.*)\)$")
_FILE_LOC = re.compile(r'^"[^"]*":(\d+):\d+$')
_NAMED_LOC = re.compile(r'^"[^"]*"\((#loc\d*)\)$')
_CALLSITE = re.compile(r"^callsite\((#loc\d*) at (#loc\d*)\)$")
_OPERANDS = re.compile(_NAME)

_BINARY = {
    "arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b,
    "arith.andi": lambda a, b: a & b, "arith.ori": lambda a, b: a | b, "arith.xori": lambda a, b: a ^ b,
    "arith.minsi": min, "arith.maxsi": max,
}


def _wrap(value: int, width: int) -> int:
    if width == 1:
        return value & 1
    mask = (1 << width) - 1
    value &= mask
    return value - (1 << width) if value >> (width - 1) else value


def _unsigned(value: int, width: int) -> int:
    return value & ((1 << width) - 1)


def _width(type_text: str) -> int | None:
    match = re.fullmatch(r"i(\d+)", type_text.strip())
    return int(match.group(1)) if match else None


def _truncating_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _compare(pred: str, a: int, b: int, width: int) -> int:
    if pred in ("ult", "ule", "ugt", "uge"):
        a, b, pred = _unsigned(a, width), _unsigned(b, width), "s" + pred[1:]
    return int({"slt": a < b, "sle": a <= b, "sgt": a > b, "sge": a >= b, "eq": a == b, "ne": a != b}[pred])


@dataclass(frozen=True)
class MaskedSelect:
    """An ``arith.select`` with a tensor mask in a loop body: its mask's value name, whether its
    true operand is a constant (``where(~m, fill, x)``: the select keeps its computed value where
    the mask is false), and the source line of its location."""
    mask: str
    fill_first: bool
    line: int | None


@dataclass(frozen=True)
class Loop:
    """A top-level ``scf.for``: the source line of its location, its bound value names, the width
    of its induction variable, and the selects with a tensor mask its body holds."""
    line: int | None
    lower: str
    upper: str
    step: str
    width: int
    selects: tuple[MaskedSelect, ...] = ()
    claim: str | None = None        # a copy elide-uniform-masks marked: "masked" or "unmasked" tiles only
    split_line: int | None = None   # the source line of the select a marked copy was split on
    branches: tuple = ()            # the Branch-es of the mask elide-uniform-masks' branch form put in its body

    @property
    def masked_selects(self) -> int:
        return len(self.selects)


@dataclass(frozen=True)
class Branch:
    """An ``scf.if`` in a loop body whose then-arm gives a select's mask as a constant: its
    condition is ``combine`` of two compares of the induction variable with function-level values
    (``(predicate, value name)`` each); on every tile where it holds, the mask of each select that
    reads ``root`` (this if's result, or that of the if whose else-arm yields it), read as
    ``where(mask, x, fill)``, must be uniformly ``constant`` -- the claim of the if's attribute.
    ``yielded`` is the constant its then-arm yields (None: not a constant), which together with
    each select's arm order must say the same."""
    combine: str
    first: tuple[str, str]
    second: tuple[str, str]
    constant: bool
    root: str | None = None
    yielded: bool | None = None

    def holds(self, iv: int, values: dict, width: int) -> bool | None:
        """Whether the condition holds at ``iv``; None where a bound is not a known value."""
        compares = []
        for predicate, bound in (self.first, self.second):
            if bound not in values:
                return None
            compares.append(_compare(predicate, iv, values[bound], width))
        return bool(compares[0] & compares[1] if self.combine == "arith.andi" else compares[0] | compares[1])


@dataclass
class _OpenIf:
    """An ``scf.if`` being read: its condition, the result its value reaches the selects through
    (``root``: its own, or, for an if in the else-arm of another, that one's -- assumed, not read, to
    yield it; the GPU comparison checks what the else-arms compute), which arm is being read, and the
    value its then-arm yields."""
    condition: str
    root: str | None
    in_else: bool = False
    yielded: str | None = None


# The unit attributes elide-uniform-masks puts on a copy's scf.for: it runs the select's constant arm
# (every tile all-masked) or its computed value (every tile unmasked).
_CLAIMS = {"tritonpatch.masked_copy": "masked", "tritonpatch.unmasked_copy": "unmasked"}
# The unit attributes of elide-uniform-masks' branch form on an scf.if: where its condition holds the
# select keeps its computed value everywhere (the mask, as where(mask, x, fill), is all-true), or nowhere.
_BRANCH_CLAIMS = {"tritonpatch.unmasked_branch": True, "tritonpatch.masked_branch": False}
_IF = re.compile(r"^(?:(" + _NAME + r")(?::\d+)? = )?scf\.if (" + _NAME + r")\b")
_YIELD = re.compile(r"^scf\.yield (" + _NAME + r")")
_SELECT = re.compile(r"= arith\.select (" + _NAME + "), (" + _NAME + "), " + _NAME + r" : tensor<[^>]*xi1[,>]")
_DENSE_BOOL = {"dense<true>": True, "dense<false>": False}
_IV_COMPARE = re.compile(r"^([a-z]+), (" + _NAME + r"), (" + _NAME + r")$")


_SPLIT_SELECT = "tritonpatch.split_select"   # = "file.py:LINE" of the select a marked copy was split on


def _attributes(closing: str) -> dict[str, str]:
    """The attribute dictionary of a region op's closing line: name -> value text (unit: "")."""
    attributes = re.match(r"\}\s*\{([^}]*)\}", closing)
    pairs = (item.partition("=") for item in attributes.group(1).split(",")) if attributes else ()
    return {name.strip(): value.strip() for name, _, value in pairs}


def _claim(attributes: dict) -> str | None:
    return next((claim for name, claim in _CLAIMS.items() if name in attributes), None)


def _split_line(attributes: dict) -> int | None:
    line = re.fullmatch(r'"[^"]*:(\d+)"', attributes.get(_SPLIT_SELECT, ""))
    return int(line.group(1)) if line else None


def _branch(head: _OpenIf, constant: bool, iv: str, defs: dict, constants: dict) -> Branch | None:
    """The :class:`Branch` of the scf.if ``head`` (the body's ops in ``defs``: name -> (op, rest);
    ``constants``: name -> text of every ``arith.constant``), None where its condition is not a
    combination of two compares of ``iv`` with other values."""
    op, rest = defs.get(head.condition, (None, ""))
    operands = _OPERANDS.findall(rest.rpartition(" : ")[0])
    if op not in ("arith.andi", "arith.ori") or len(operands) != 2:
        return None
    compares = []
    for operand in operands:
        compare_op, compare_rest = defs.get(operand, (None, ""))
        match = _IV_COMPARE.match(compare_rest.rpartition(" : ")[0].strip())
        if compare_op != "arith.cmpi" or not match or match.group(2) != iv:
            return None
        compares.append((match.group(1), match.group(3)))
    yielded = _DENSE_BOOL.get(constants.get(head.yielded, "").partition(" : ")[0].strip())
    return Branch(op, compares[0], compares[1], constant, head.root, yielded)


class ScalarProgram:
    """The scalar part of one kernel's TTIR: argument names, the function-level integer ops and
    the top-level loops, ready to evaluate for any argument values."""

    def __init__(self, text: str):
        lines = text.split("\n")
        self.arguments: list[str] = []
        self.ops: list[tuple[str, str, str]] = []     # (result, op, rest), function-level, in order
        self.loops: list[Loop] = []
        locations = dict(m.groups() for m in map(_LOC_DEF.match, lines) if m)
        constants = {}                             # name -> text of every arith.constant
        depth, opened = 0, []                      # opened: (depth, head) of each open region
        body_defs, branches, selects, iv = {}, [], [], None     # of the top-level loop being read
        for text_line in lines:
            stripped = text_line.strip()
            if stripped.startswith("tt.func"):
                self.arguments = [name for name, _ in _ARG.findall(stripped.split("(", 1)[1])]
            definition = _DEF.match(text_line)
            if definition and definition.group(2) == "arith.constant":
                constants[definition.group(1)] = definition.group(3)
            if depth > 2 and (select := _SELECT.search(stripped)):
                ref = _LOC_REF.search(stripped)
                selects.append(MaskedSelect(select.group(1), select.group(2) in constants,
                                            _resolve_line(ref.group(1), locations) if ref else None))
            if depth > 2 and (yielded := _YIELD.match(stripped)) and opened and opened[-1][0] == depth - 1:
                head = opened[-1][1]
                if isinstance(head, _OpenIf) and not head.in_else:
                    head.yielded = yielded.group(1)
            carried = None                                   # an scf.if, on to its else arm
            if stripped.startswith("}"):
                depth -= 1
                if opened and opened[-1][0] == depth:
                    _, head = opened.pop()
                    if isinstance(head, _OpenIf) and stripped.endswith("{"):
                        head.in_else, carried = True, head
                    elif isinstance(head, _OpenIf):
                        names = _attributes(stripped)
                        claims = [constant for name, constant in _BRANCH_CLAIMS.items() if name in names]
                        if claims:
                            branches.append(_branch(head, claims[0], iv, body_defs, constants))
                    elif head is not None:
                        ref = _LOC_REF.search(stripped)
                        line = _resolve_line(ref.group(1), locations) if ref else None
                        attributes = _attributes(stripped)
                        self.loops.append(Loop(line, *head, selects=tuple(selects), claim=_claim(attributes),
                                               split_line=_split_line(attributes), branches=tuple(branches)))
                        selects, body_defs, branches = [], {}, []
            if depth == 2 and not stripped.startswith("}"):   # module { tt.func { <here>
                loop = _FOR.search(stripped)
                if loop:
                    iv, lower, upper, step, iv_type = loop.groups()
                    opened.append((depth, (lower, upper, step, _width(iv_type))))
                elif definition and not stripped.endswith("{"):
                    self.ops.append(definition.groups())
            elif depth > 2 and definition:                   # inside a top-level loop
                body_defs[definition.group(1)] = definition.group(2, 3)
            if stripped.endswith("{"):
                if carried is not None:
                    opened.append((depth, carried))
                elif depth > 2 and (branch := _IF.match(stripped)):
                    parent = opened[-1][1] if opened else None
                    # an if in the else-arm of a branch gives its value through that branch's result
                    root = parent.root if isinstance(parent, _OpenIf) and parent.in_else else branch.group(1)
                    opened.append((depth, _OpenIf(branch.group(2), root)))
                elif not (depth == 2 and _FOR.search(stripped)):
                    opened.append((depth, None))
                depth += 1

    def evaluate(self, arguments: list, pids: tuple[int, int, int]) -> dict[str, int]:
        """Values of the function-level integer scalars: ``arguments`` gives, for each argument of
        the TTIR function in order, ``(value, bit width)`` or None (pointers)."""
        values: dict[str, int] = {}
        widths: dict[str, int] = {}
        for name, argument in zip(self.arguments, arguments):
            if argument is not None:
                values[name], widths[name] = argument
        for result, op, rest in self.ops:
            evaluated = _evaluate_op(op, rest, values, widths, pids)
            if evaluated is not None:
                values[result], widths[result] = evaluated
        return values

    def loop_bounds(self, arguments: list, pids) -> list[tuple[Loop, tuple | None]]:
        """Each top-level loop with ``(lower, upper, step)`` under the arguments, None where a
        bound is not a function-level integer scalar of the arguments."""
        values = self.evaluate(arguments, pids)
        out = []
        for loop in self.loops:
            bounds = tuple(values.get(name) for name in (loop.lower, loop.upper, loop.step))
            out.append((loop, None if None in bounds else bounds))
        return out


def _resolve_line(ref: str, locations: dict[str, str], depth: int = 0) -> int | None:
    """The source line a ``#locN`` stands for (through names and call sites)."""
    text = locations.get(ref)
    if text is None or depth > 20:
        return None
    for pattern, group in ((_FILE_LOC, None), (_NAMED_LOC, 1), (_CALLSITE, 2)):
        match = pattern.match(text)
        if match:
            return int(match.group(1)) if group is None else _resolve_line(match.group(group), locations, depth + 1)
    return None


def _evaluate_op(op: str, rest: str, values: dict, widths: dict, pids) -> tuple[int, int] | None:
    """(value, width) of one scalar op, None when it is not a scalar integer op of known values."""
    body, _, type_text = rest.rpartition(" : ")
    if "tensor<" in rest or "!tt.ptr" in rest:
        return None
    if op == "tt.get_program_id":
        axis = body.strip()
        return (pids["xyz".index(axis)], 32) if axis in ("x", "y", "z") else None
    if op == "arith.constant":
        if rest.strip() in ("true", "false"):
            return int(rest.strip() == "true"), 1
        match = re.fullmatch(r"\s*(-?\d+)\s*:\s*(i\d+)\s*", rest)
        return (_wrap(int(match.group(1)), _width(match.group(2))), _width(match.group(2))) if match else None
    names = _OPERANDS.findall(body)
    if any(name not in values for name in names):
        return None
    args = [values[name] for name in names]
    if op in ("arith.extsi", "arith.extui", "arith.trunci"):
        source, _, target = type_text.partition(" to ")
        source_width, width = _width(source), _width(target)
        if source_width is None or width is None or len(args) != 1:
            return None
        value = _unsigned(args[0], source_width) if op == "arith.extui" else args[0]
        return _wrap(value, width), width
    width = _width(type_text)
    if width is None:
        return None
    if op == "arith.cmpi":
        pred = body.split(",", 1)[0].strip()
        return _compare(pred, args[0], args[1], width), 1
    if op == "arith.select" and len(args) == 3:
        return (args[1] if args[0] else args[2]), width
    if op in _BINARY and len(args) == 2:
        return _wrap(_BINARY[op](args[0], args[1]), width), width
    if op in ("arith.divsi", "arith.remsi") and len(args) == 2:
        if args[1] == 0:
            return None
        quotient = _truncating_div(args[0], args[1])
        return _wrap(quotient if op == "arith.divsi" else args[0] - quotient * args[1], width), width
    return None


# --- iteration sets ---------------------------------------------------------------------------------
def iterations(lower: int, upper: int, step: int) -> tuple[int, int]:
    """(first, count) of ``for iv = lower; iv < upper; iv += step`` (step > 0)."""
    if step <= 0:
        raise ValueError(f"loop step {step} is not positive")
    return lower, max(0, -(-(upper - lower) // step))


def check_segments(original: tuple[int, int, int], segments: list[tuple[int, int, int]], exact: bool) -> str | None:
    """None if the patched loops ``segments`` (in program order) run a contiguous run of the
    original loop's iterations, in order, inside ``[lower, upper)`` -- all of them when ``exact``;
    else what is wrong."""
    lower, upper, step = original
    first, count = iterations(lower, upper, step)
    last = first + (count - 1) * step
    expected_next = None
    total = 0
    for lo, hi, seg_step in segments:
        if seg_step <= 0:
            return f"a patched loop has step {seg_step}"
        seg_first, seg_count = iterations(lo, hi, seg_step)
        if seg_count == 0:
            continue
        seg_last = seg_first + (seg_count - 1) * seg_step
        if count == 0:
            return (f"the original loop [{lower}, {upper}) step {step} runs no iteration, a patched loop runs "
                    f"[{lo}, {hi}) step {seg_step} ({seg_count} iterations)")
        if seg_step != step and seg_count > 1:
            return f"patched loop step {seg_step} != original step {step}"
        if seg_first < first or seg_last > last or (seg_first - first) % step:
            return (f"patched loop [{lo}, {hi}) step {seg_step} runs iterations outside the original "
                    f"[{lower}, {upper}) step {step}")
        if expected_next is not None and seg_first != expected_next:
            return (f"patched loops are not contiguous: one starts at {seg_first}, the previous one ended "
                    f"before {expected_next}")
        expected_next = seg_last + step
        total += seg_count
    if exact and total != count:
        return f"patched loops run {total} of the original loop's {count} iterations (all expected)"
    return None


def dropped_iterations(original: tuple[int, int, int], segments: list[tuple[int, int, int]], limit: int):
    """Up to ``limit`` leading and ``limit`` trailing iteration values the patched loops skip."""
    lower, upper, step = original
    first, count = iterations(lower, upper, step)
    kept = [iterations(lo, hi, s) for lo, hi, s in segments]
    kept = [(f, n) for f, n in kept if n > 0]
    if not kept:
        lead, trail = count, 0
    else:
        lead = (kept[0][0] - first) // step
        trail = count - lead - sum(n for _, n in kept)
    values = [first + k * step for k in range(min(lead, limit))]
    values += [first + (count - 1 - k) * step for k in range(min(trail, limit))]
    return values

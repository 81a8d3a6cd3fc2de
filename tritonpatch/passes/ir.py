"""A small model of Triton's textual TTIR / TTGIR, just enough for the mask rewrites, and the
questions the passes ask of its operations.

:class:`Module` holds the lines of a module (:mod:`.ir_syntax`: each kept as printed, so unchanged
code round-trips byte for byte) and adds the nesting of regions, a function-wide map from value
name to defining line, the uses of each op, and a builder for new lines with fresh value names.
The predicates below say what an operation may do (:func:`is_movable`, :func:`has_side_effect`),
whether a line is a tensor select (:func:`select_parts`) and what constant a loop steps by
(:func:`constant_step`).
"""
from __future__ import annotations

import re

from .ir_syntax import (NAME_END, VALUE_NAME, VALUE_RE, Line, TensorType, base_name, int_width, parse_for, parse_line,
                        parse_type, split_top_level)

_BLOCK_ARGS_RE = re.compile(r"(" + VALUE_NAME + r"): ")


class Module:
    """The lines of a module with a function-wide map from value name to defining line."""

    def __init__(self, text: str):
        self.trailing_newline = text.endswith("\n")
        self.lines = [parse_line(t) for t in text.split("\n")[:-1 if self.trailing_newline else None]]
        self._counter = 0
        self.reindex()
        unique = self._unique_names()
        if unique is not None:
            self.lines = [parse_line(t) for t in unique]
            self.reindex()

    def replace(self, texts: list[str]) -> None:
        """Replace every line (re-parsing them); fresh names keep counting up."""
        counter = self._counter
        self.__init__("\n".join(texts) + ("\n" if self.trailing_newline else ""))
        self._counter = counter

    def text(self) -> str:
        return "\n".join(line.text for line in self.lines) + ("\n" if self.trailing_newline else "")

    def reindex(self) -> None:
        """Recompute region nesting and the definition map after an edit."""
        self.close_of: dict[int, int] = {}
        self.parent_of: list[int | None] = []
        stack: list[int] = []
        for index, line in enumerate(self.lines):
            if line.closes and stack:
                opener = stack.pop()
                if line.opens:
                    stack.append(opener)          # "} else {": the same op continues
                else:
                    self.close_of[opener] = index
                self.parent_of.append(opener)
            else:
                self.parent_of.append(stack[-1] if stack else None)
                if line.opens:
                    stack.append(index)
        self.defs: dict[str, int] = {name: index for index in range(len(self.lines))
                                     for name, _, _ in self._definitions(index)}

    def _definitions(self, index: int) -> list[tuple[str, int, int]]:
        """(name, first line, last line of its scope) for each value line ``index`` defines."""
        line = self.lines[index]
        parent = self.parent_of[index]
        region_end = self.end_of(parent) if parent is not None else len(self.lines) - 1
        found = []
        loop = parse_for(line) if line.op == "scf.for" else None
        if loop:
            found += [(name, index, self.end_of(index)) for name in [loop.iv] + [a for a, _ in loop.iter_args]]
        elif line.text.lstrip().startswith("^") or line.op == "tt.func":
            found += [(name, index, region_end if line.op != "tt.func" else self.end_of(index))
                      for name in _BLOCK_ARGS_RE.findall(line.text)]
        found += [(name, index, region_end) for name in line.results]
        return found

    def _unique_names(self) -> list[str] | None:
        """The lines with values that reuse a name of an earlier sibling region renamed (MLIR's
        printer reuses names across sibling regions, e.g. two loops one after the other; the model
        maps each name to one definition). None when every name is unique already."""
        seen: set[str] = set()
        taken: set[str] | None = None          # every name in the text, gathered at the first reuse
        starts: dict[int, list[tuple[str, str, int]]] = {}
        for index in range(len(self.lines)):
            for name, first, last in self._definitions(index):
                if name not in seen:
                    seen.add(name)
                    continue
                if taken is None:
                    taken = {t for line in self.lines for t in VALUE_RE.findall(line.text)}
                counter = len(taken)
                while f"%u{counter}_{name[1:]}" in taken:
                    counter += 1
                new_name = f"%u{counter}_{name[1:]}"
                taken.add(new_name)
                starts.setdefault(first, []).append((name, new_name, last))
        if not starts:
            return None
        active: dict[str, list[tuple[str, int]]] = {}
        texts = []
        for index, line in enumerate(self.lines):
            for name, new_name, last in starts.get(index, []):
                active.setdefault(name, []).append((new_name, last))
            for name in list(active):
                active[name] = [(n, last) for n, last in active[name] if last >= index]
                if not active[name]:
                    del active[name]
            if not active:
                texts.append(line.text)
                continue
            texts.append(re.sub(VALUE_NAME + NAME_END,
                                lambda m: active[m.group(0)][-1][0] if m.group(0) in active else m.group(0), line.text))
        return texts

    # --- structure -------------------------------------------------------------------------
    def end_of(self, index: int) -> int:
        """Index of the last line of the operation starting at ``index`` (itself if no region)."""
        return self.close_of.get(index, index)

    def children(self, opener: int) -> list[int]:
        """Start lines of the operations directly inside the region(s) of the op at ``opener``."""
        result, index, end = [], opener + 1, self.end_of(opener)
        while index < end:
            line = self.lines[index]
            if not line.closes and not line.text.lstrip().startswith("^") and line.text.strip():
                result.append(index)
                index = self.end_of(index) + 1
            else:
                index += 1
        return result

    def loops(self) -> list[int]:
        return [i for i, line in enumerate(self.lines) if line.op == "scf.for" and parse_for(line)]

    def enclosing_ops(self, index: int) -> list[int]:
        """Openers of the regions containing line ``index``, innermost first."""
        chain, parent = [], self.parent_of[index]
        while parent is not None:
            chain.append(parent)
            parent = self.parent_of[parent]
        return chain

    def inside(self, index: int, opener: int) -> bool:
        return opener < index <= self.end_of(opener)

    def uses(self, start: int) -> set[str]:
        """Values the op at ``start`` (with its regions) uses that are defined outside it."""
        end = self.end_of(start)
        found = set()
        for index in range(start, end + 1):
            for value in self.lines[index].operands:
                where = self.defs.get(base_name(value))
                if where is None or not start <= where <= end:
                    found.add(base_name(value))
        return found

    def users(self, name: str, within: range | None = None) -> list[int]:
        """Lines (in ``within``) that use ``name`` (or one of its results ``name#k``)."""
        lines = within if within is not None else range(len(self.lines))
        return [i for i in lines if any(base_name(v) == name for v in self.lines[i].operands)]

    # --- building ----------------------------------------------------------------------------
    def fresh(self, hint: str = "tp") -> str:
        """A value name not used anywhere in the module."""
        while True:
            self._counter += 1
            name = f"%{hint}_{self._counter}"
            if name not in self.defs:
                self.defs[name] = -1
                return name


def type_of(module: Module, name: str) -> str | None:
    """The result type of value ``name`` as printed on its defining line (single-result ops and
    scf.for iteration arguments / induction variable), or None when it cannot be read."""
    index = module.defs.get(base_name(name))
    if index is None or index < 0:
        return None
    line = module.lines[index]
    if line.op == "scf.for":
        loop = parse_for(line)
        if name == loop.iv:
            return loop.iv_type
        for position, (arg, _) in enumerate(loop.iter_args):
            if arg == name:
                return loop.result_types[position]
        if base_name(name) not in line.results:
            return None
        position = _result_position(name)                                # a loop result: %r or %r#k
        return loop.result_types[position] if position < len(loop.result_types) else None
    if line.op == "scf.if":
        return _result_type(line, name)
    if line.op == "tt.func" or line.text.lstrip().startswith("^"):
        match = re.search(re.escape(name) + r": ([^ ,)]+(?:<[^>]*>)?)", line.text)
        return match.group(1) if match else None
    if len(line.results) == 1 and line.opens and ":" not in line.text.split("=", 1)[0]:
        return _closing_type(module.lines[module.end_of(index)].text)
    if len(line.results) != 1 or line.opens:
        return None
    body = line.body
    if " -> " in body:
        return body.rsplit(" -> ", 1)[1].strip()
    if " to " in body and line.op in ("arith.extsi", "arith.extui", "arith.trunci", "arith.sitofp",
                                       "arith.extf", "arith.truncf", "arith.bitcast", "arith.index_cast"):
        return body.rsplit(" to ", 1)[1].strip()
    if line.op == "arith.cmpi":
        operand_type = parse_type(body.rsplit(" : ", 1)[1])
        return operand_type.text(element="i1") if isinstance(operand_type, TensorType) else "i1"
    if line.op == "arith.constant" and " : " not in body:
        return "i1" if body.strip() in ("true", "false") else None
    if " : " in body:
        types = split_top_level(body.rsplit(" : ", 1)[1])
        return types[0] if line.op == "tt.addptr" else types[-1]
    return None


_CLOSING_TYPE = re.compile(r"^\s*\}\)\s*:\s*\(.*\)\s*->\s*([^()\s]+(?:<[^>]*>)?)\s*(?:loc\(.*)?$")


def _closing_type(closing: str) -> str | None:
    """The one result type of a generic-form region op, printed on its closing line
    (``%s = "tt.reduce"(%x) <{axis = 0 : i32}> ({ ... }) : (tensor<4xi32>) -> i32``)."""
    match = _CLOSING_TYPE.match(closing)
    return match.group(1) if match else None


def _result_type(line: Line, name: str) -> str | None:
    """The type of result ``name`` (``%r``, or ``%r#k`` of a multi-result op) of an ``scf.if``, whose
    opening line ends with its result types (``%r = scf.if %c -> (i32) {``, ``%r:2 = scf.if %c -> (i32, f32) {``)."""
    if base_name(name) not in line.results or " -> " not in line.body:
        return None
    listed = line.body.rsplit(" -> ", 1)[1].strip().removesuffix("{").strip()
    if listed.startswith("(") and listed.endswith(")"):
        listed = listed[1:-1]
    types = split_top_level(listed)
    position = _result_position(name)
    return types[position].strip() if position < len(types) else None


def _result_position(name: str) -> int:
    """Which result of a multi-result op ``name`` is: ``k`` for ``%r#k``, 0 for ``%r``."""
    return int(name.split("#", 1)[1]) if "#" in name else 0


def region_ops(module: Module, index: int) -> list[str]:
    """The operation names inside the region(s) of the op at ``index`` (a ``tt.reduce``'s combiner),
    in order; block labels and closing braces left out."""
    return [module.lines[i].op for i in range(index + 1, module.end_of(index))
            if module.lines[i].op and not module.lines[i].closes and not module.lines[i].text.lstrip().startswith("^")]


# --- what an operation may do ------------------------------------------------------------------------
_TRAPPING_ARITH = ("arith.divsi", "arith.divui", "arith.remsi", "arith.remui", "arith.ceildivsi", "arith.floordivsi",
                   "arith.ceildivui")
_MOVABLE_OPS = ("tt.splat", "tt.broadcast", "tt.expand_dims", "tt.make_range", "tt.reshape", "tt.trans",
                "ttg.convert_layout", "tt.addptr", "tt.bitcast", "tt.int_to_ptr", "tt.ptr_to_int")
_EFFECT_FREE_OPS = _MOVABLE_OPS + (
    "tt.load", "tt.descriptor_load", "tt.dot", "tt.dot_scaled", "tt.reduce", "tt.reduce.return", "tt.scan",
    "tt.scan.return", "tt.join", "tt.split", "tt.cat", "tt.gather", "tt.histogram", "tt.unsplat", "tt.advance",
    "tt.make_tensor_ptr", "tt.fp_to_fp", "tt.precise_sqrt", "tt.precise_divf", "tt.mulhiui", "tt.clampf",
    "tt.get_program_id", "tt.get_num_programs", "scf.for", "scf.if", "scf.yield")
_PURE_FLAG_OPS = ("tt.elementwise_inline_asm", "tt.extern_elementwise")   # effect-free only with ``pure = true``
_STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')                  # MLIR escapes quotes and backslashes
_PURE_ATTRIBUTE = re.compile(r"[{,]\s*pure\s*=\s*true\s*[,}]")


def declared_pure(line: Line) -> bool:
    """Whether the op's attribute dictionary says ``pure = true``; the string attributes (the asm
    text, a symbol name) are blanked first, so text inside them never counts."""
    return _PURE_ATTRIBUTE.search(_STRING_LITERAL.sub('""', line.body)) is not None


def is_movable(line: Line) -> bool:
    """Whether the operation on ``line`` has no side effects, reads no memory and never traps, so
    that moving it (out of a loop, out from under a branch) or deleting it when unused is exact.
    An allow-list: integer division (undefined for a zero divisor) and every operation not named
    here count as not movable."""
    return (line.op.startswith(("arith.", "math.")) and line.op not in _TRAPPING_ARITH) or line.op in _MOVABLE_OPS


def has_side_effect(line: Line) -> bool:
    """Whether the operation on ``line`` may have an effect beyond its results (a store, an atomic,
    a print, a call, impure inline assembly, a volatile load, a loop that may not terminate, or any
    operation this allow-list does not know). Reads of memory and traps are not effects here: an
    iteration without effects that leaves the loop state unchanged may be dropped."""
    if not line.op or line.op == "}" or line.text.lstrip().startswith("^"):
        return False                                   # closing braces and block labels
    if line.op.startswith(("arith.", "math.")):
        return False
    if line.op in _PURE_FLAG_OPS:
        return not declared_pure(line)
    if line.op in ("tt.load", "tt.descriptor_load"):
        return "isVolatile = true" in line.text
    return line.op not in _EFFECT_FREE_OPS


def loop_label(module: Module, loop: int) -> str:
    """How a pass's notes name a loop: its induction variable, the source line it came from and its line in
    the IR, ``loop %start_n at masked_attention.py:24 (TTIR line 59)``."""
    source = source_line(module, module.end_of(loop))
    return f"loop {parse_for(module.lines[loop]).iv}{f' at {source}' if source else ''} (IR line {loop + 1})"


def no_select_reason(module: Module, loop: int) -> str:
    """Why the mask passes found no tensor select (``tl.where``) directly in a loop's body: there is none, or
    each sits in a region nested in the body (a branch, ``scf.if``: the passes do not rewrite selects there;
    an inner loop: rewritten as a loop of its own), so a report tells "no mask here" from "mask not reached"."""
    nested = next((index for index in range(loop + 1, module.end_of(loop)) if select_parts(module, index)), None)
    if nested is None:
        return "its body has no tensor select (tl.where)"
    region = next(child for child in module.children(loop) if module.inside(nested, child))
    where = (f"an scf.if in its body (IR line {region + 1}; selects under a branch are not rewritten)"
             if module.lines[region].op == "scf.if" else
             f"an inner loop (IR line {region + 1}; rewritten as a loop of its own)"
             if module.lines[region].op == "scf.for" else f"a nested {module.lines[region].op} (IR line {region + 1})")
    return f"its tensor selects (tl.where) sit only inside {where}"


_LOC_ALIAS_RE = re.compile(r"^(#loc\d*) = (loc\(.*\))\s*$")
_FILE_LOC_RE = re.compile(r'^loc\("([^"]+)":(\d+):\d+\)$')


def source_line(module: Module, index: int) -> str | None:
    """``file.py:LINE`` of the operation at ``index`` (a region op's location sits on its closing line), read
    through the module's location aliases: a named location by what it names, a call site by the caller's
    line; None when the IR carries no file location."""
    aliases = {m.group(1): m.group(2) for m in map(_LOC_ALIAS_RE.match, (l.text for l in module.lines)) if m}
    loc, seen = module.lines[index].loc, set()
    while loc and loc not in seen:
        seen.add(loc)
        inner = loc[4:-1] if loc.startswith("loc(") and loc.endswith(")") else ""
        if inner.startswith("#loc"):
            loc = aliases.get(inner, "")
            continue
        file_loc = _FILE_LOC_RE.match(loc)
        if file_loc:
            return f"{file_loc.group(1).rsplit('/', 1)[-1]}:{file_loc.group(2)}"
        called = re.match(r"^callsite\(\S+ at (#loc\d*)\)$", inner)
        named = re.match(r'^"[^"]*"\((#loc\d*)\)$', inner)
        reference = called or named
        loc = aliases.get(reference.group(1), "") if reference else ""
    return None


# --- what a line holds -------------------------------------------------------------------------------
def select_parts(module: Module, index: int):
    """(mask, true value, false value, result type) of a tensor-mask select line, else None."""
    line = module.lines[index]
    if line.op != "arith.select" or len(line.results) != 1:
        return None
    operands = line.operands
    types = split_top_level(line.body.rsplit(" : ", 1)[1]) if " : " in line.body else []
    if len(operands) != 3 or len(types) != 2 or not isinstance(parse_type(types[0]), TensorType):
        return None
    return operands[0], operands[1], operands[2], types[1]


def constant_step(module: Module, name: str) -> int | None:
    """The value of a positive integer constant (a loop step), else None."""
    index = module.defs.get(name)
    line = module.lines[index] if index is not None and index >= 0 else None
    if line is None or line.op != "arith.constant":
        return None
    match = re.match(r"\s*(\d+)\s*:", line.body)
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def loop_advances(module: Module, loop: int, ops: tuple[str, ...] = ("arith.addi",)) -> dict[int, int]:
    """The iteration arguments ``loop`` advances by one operation: position -> the body line that computes
    the argument's yielded value as ``op(arg, increment)``, ``op`` one of ``ops`` (in yield order)."""
    head = parse_for(module.lines[loop])
    found = {}
    yielded = module.lines[module.children(loop)[-1]].operands
    for position, value in enumerate(yielded[:len(head.iter_args)]):   # (verified IR yields one per argument)
        index = module.defs.get(base_name(value))
        if index is None or "#" in value or not module.inside(index, loop):
            continue
        line = module.lines[index]
        if line.op in ops and len(line.operands) == 2 and line.operands[0] == head.iter_args[position][0]:
            found[position] = index
    return found


def increment_scalar(module: Module, increment: str):
    """("value", name) / ("constant", int) of the scalar an increment is (or splats), None for
    other tensors (their advance by a count is not expressible as one scalar product)."""
    increment_type = parse_type(type_of(module, increment) or "")
    if not isinstance(increment_type, TensorType):
        return ("value", increment) if int_width(increment_type) in (32, 64) else None
    source = module.lines[module.defs[base_name(increment)]]
    if source.op == "tt.splat" and len(source.operands) == 1:
        return ("value", source.operands[0])
    constant = re.match(r"\s*dense<(-?\d+)>", source.body) if source.op == "arith.constant" else None
    return ("constant", int(constant.group(1))) if constant else None


def invariant_chain(module: Module, loop: int, name: str) -> list[int] | None:
    """The lines inside ``loop`` that compute ``name``, in program order, when it depends on nothing the
    loop changes: only on values defined before the loop, through single-line operations that may be
    moved (:func:`is_movable`). ``[]`` for a value defined before the loop; None for one that depends on an
    iteration argument, the induction variable, a load or anything else the loop may change."""
    index = module.defs.get(base_name(name))
    if index is None or index < 0 or "#" in name or index == loop:
        return None                                    # index == loop: an iteration argument or the iv
    if not module.inside(index, loop):
        return []
    line = module.lines[index]
    if line.opens or len(line.results) != 1 or not is_movable(line):
        return None
    chain = {index}
    for operand in line.operands:
        part = invariant_chain(module, loop, operand)
        if part is None:
            return None
        chain.update(part)
    return sorted(chain)


def result_used_after(module: Module, op: int, position: int) -> bool:
    """Whether result ``position`` of the ``scf.for`` / ``scf.if`` at ``op`` is used after it. A use
    by the ``scf.yield`` of an enclosing ``scf.if`` (a versioned loop, :mod:`.versioning`) counts
    only when that ``scf.if``'s result is used after it."""
    results = module.lines[op].results
    if not results:
        return False
    token = f"{results[0]}#{position}" if _result_count(module, op) > 1 else results[0]
    pattern = re.compile(re.escape(token) + r"(?![A-Za-z0-9_$.\-#])")
    for index in range(module.end_of(op) + 1, len(module.lines)):
        line = module.lines[index]
        if not pattern.search(line.body):
            continue
        parent = module.parent_of[index]
        if line.op == "scf.yield" and parent is not None and module.lines[parent].op == "scf.if":
            if any(result_used_after(module, parent, k) for k, v in enumerate(line.operands) if v == token):
                return True
            continue
        return True
    return False


def _result_count(module: Module, op: int) -> int:
    """How many results the ``scf.for`` / ``scf.if`` at ``op`` has."""
    line = module.lines[op]
    if line.op == "scf.for":
        return len(parse_for(line).iter_args)
    match = re.search(r"-> \((.*)\) \{\s*$", line.body) or re.search(r"-> (.*) \{\s*$", line.body)
    return len(split_top_level(match.group(1))) if match else 0


# --- editing fragments ---------------------------------------------------------------------------
REGISTER_MOVES = {"f32": ("mov.b32 $0, $1;", "r"), "f16": ("mov.b16 $0, $1;", "h"),
                  "bf16": ("mov.b16 $0, $1;", "h"), "f64": ("mov.b64 $0, $1;", "l")}
"""Float element type -> (a register move of that width, its constraint letter): an op that returns
its operand bit for bit, opaque to LLVM and free in ptxas."""


def inline_asm_line(result: str, asm: str, register: str, operands: list[str], type_text: str, indent: str,
                    loc: str) -> str:
    """A pure ``tt.elementwise_inline_asm`` line computing ``result`` of ``type_text``."""
    constraints = ",".join(["=" + register] + [register] * len(operands))
    return (f'{indent}{result} = tt.elementwise_inline_asm "{asm}" {{constraints = "{constraints}", '
            f'packed_element = 1 : i32, pure = true}} {", ".join(operands)} : '
            f'{", ".join([type_text] * len(operands))} -> {type_text} {loc}').rstrip()


def substitute(text: str, old: str, new: str) -> str:
    """``text`` with every use of value ``old`` (also ``old#k``) replaced by ``new``."""
    return re.sub(re.escape(old) + NAME_END, lambda _: new, text)


def without_dead_ops(lines: list[str], removable) -> list[str]:
    """The loop's lines without the single-line ops inside it whose results are unused and that
    ``removable(line)`` allows to drop (repeated until none is left)."""
    while True:
        fragment = Module("\n".join(lines))
        used = {base_name(v) for line in fragment.lines for v in line.operands}
        dead = [i for i, line in enumerate(fragment.lines[1:-1], start=1)
                if line.results and not line.opens and not line.closes and removable(line)
                and not any(r in used for r in line.results)]
        if not dead:
            return lines
        lines = [text for i, text in enumerate(lines) if i not in dead]


def renamed(lines: list[str], prefix: str) -> list[str]:
    """The loop's lines with every value defined inside it renamed to ``%<prefix>_<name>`` (the
    copies of a loop then define distinct names, as the rest of the pass machinery expects)."""
    fragment = Module("\n".join(lines))
    inner = sorted((n for n, i in fragment.defs.items() if i > 0 or n not in fragment.lines[0].results),
                   key=len, reverse=True)
    if not inner:
        return lines
    pattern = re.compile("(" + "|".join(re.escape(n) for n in inner) + ")" + NAME_END)
    return [pattern.sub(lambda m: f"%{prefix}_{m.group(1)[1:]}", text) for text in lines]

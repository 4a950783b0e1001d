"""The static gate: a graded file's syntax tree, checked against its exercise's allow-list before anything runs.

Why: a graded module must do its own work. The judge runs it sandboxed and checks what ran; this first line
refuses, from the source alone, what an honest solution never needs: imports outside the exercise's list,
reflection (``eval``, ``getattr`` with a computed name, ``globals()``), dunder attributes (``x.__class__``), the
private and low-level corners of torch and triton (``torch._C``, ``torch.ops``, PyTorch's own attention), and, in
the Triton exercises, computation with torch on the host, outside the ``@triton.jit`` kernels.

The rules are the tables below, for an instructor to read. ``check`` only reads text: it never imports or runs
the file (and this module imports neither torch nor triton).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    """One graded file's allow-list."""

    imports: tuple[str, ...]  # the modules it may import (any of their names), besides what its stub imports
    kernel: bool = False  # a Triton exercise: outside @triton.jit, torch may only allocate and describe tensors


# --- Rule tables -------------------------------------------------------------

_COMMON = ("__future__", "dataclasses", "functools", "math", "typing")
_PYTORCH = _COMMON + ("torch", "torch.nn.functional")
_TRITON = _COMMON + ("torch", "triton", "triton.language")

EXERCISES: dict[str, Exercise] = {
    "naive.py": Exercise(_PYTORCH),
    "online_softmax.py": Exercise(_PYTORCH),
    "tiled.py": Exercise(_PYTORCH),
    "forward.py": Exercise(_TRITON, kernel=True),
    "windows.py": Exercise(_TRITON, kernel=True),  # and forward.py's helpers, through its stub's impl.load
    "backward.py": Exercise(_TRITON, kernel=True),
    "decode.py": Exercise(_TRITON, kernel=True),
    "ring.py": Exercise(_PYTORCH + ("torch.distributed",)),  # a module it may import it may use: dist.*
}

# Never importable, in any graded file (nor is any module whose dotted name has a part starting with "_").
NEVER_IMPORT = frozenset({
    "sys", "os", "ctypes", "_thread", "threading", "subprocess", "multiprocessing", "importlib", "inspect", "gc",
    "builtins", "signal", "socket", "pickle", "marshal", "io", "shutil", "pathlib", "numpy", "concurrent",
    "asyncio", "code", "types", "weakref", "atexit", "resource", "mmap", "operator", "runpy", "sysconfig",
})

# Attributes refused on a chain rooted at an imported module: "*" for every module, then by library.
# (Any name starting with "_" is refused too, and numpy has a rule of its own.)
DENIED_ATTRIBUTES: dict[str, frozenset[str]] = {
    "*": NEVER_IMPORT | {"scaled_dot_product_attention", "flex_attention", "multi_head_attention_forward"},
    "torch": frozenset({"ops", "library", "utils", "backends", "classes", "hub", "jit", "compile", "compiler",
                        "overrides", "load", "save", "from_file", "distributed", "testing", "fx", "export",
                        "package", "serialization", "profiler", "MultiheadAttention", "Transformer",
                        "TransformerEncoderLayer",
                        "TransformerDecoderLayer"}),
    "triton": frozenset({"runtime", "testing", "tools", "compile", "compiler", "backends", "knobs", "profiler"}),
    "typing": frozenset({"get_type_hints", "ForwardRef"}),  # both evaluate strings as code
    # singledispatch's register() evaluates a function's annotations: a string there is code the gate never reads
    "functools": frozenset({"singledispatch", "singledispatchmethod"}),
}
DENIED_PATHS = frozenset({"torch.nn.attention", "torch.autograd.profiler"})
ALWAYS_ALLOWED_PATHS = frozenset({"triton.jit"})  # "jit" is refused under torch only

# Kernel files, outside @triton.jit: the only torch.<name> an honest launcher needs.
HOST_TORCH = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like", "float16", "half",
    "float32", "float", "bfloat16", "float64", "double", "int8", "int16", "int32", "int", "int64", "long", "uint8",
    "bool", "dtype", "device", "Tensor", "Size", "is_tensor", "no_grad", "inference_mode", "cuda", "finfo", "iinfo",
    "get_default_dtype",
})
# Kernel files, outside @triton.jit: attributes of a tensor (any non-module object) that compute attention,
# and .fn / .base_fn, a kernel's Python body (calling it runs the kernel as plain Python on the host).
HOST_METHODS = frozenset({
    "softmax", "log_softmax", "matmul", "mm", "bmm", "einsum", "exp", "exp_", "exp2", "log", "log_", "log2",
    "sum", "max", "amax", "logsumexp", "logaddexp", "mean", "cumsum", "tensordot", "baddbmm", "addmm", "addbmm",
    "dot", "mv", "outer", "where", "masked_fill", "masked_fill_", "tril", "triu", "sqrt", "repeat_interleave",
    "nansum", "prod", "logcumsumexp", "expm1", "sigmoid", "scaled_dot_product_attention", "fn", "base_fn",
    # a tensor's values into Python (to compute there), Python data back into a tensor, a callback per element
    "tolist", "item", "numpy", "tobytes", "new_tensor", "apply_", "map_", "map2_", "storage", "untyped_storage",
})

REFLECTION_NAMES = frozenset({"eval", "exec", "compile", "__import__", "globals", "vars", "locals", "breakpoint",
                              "open", "memoryview", "setattr", "delattr"})
CALL_ONLY_NAMES = frozenset({"input"})  # refused when called; as a variable's name it is often a tensor
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__doc__", "__all__", "__debug__", "__version__", "__slots__"})
# Dunder methods a class may not define: hooks that run code behind the judge's back.
HOOK_METHODS = frozenset({"__torch_function__", "__torch_dispatch__", "__getattr__", "__getattribute__", "__del__",
                          "__init_subclass__", "__set_name__", "__class_getitem__", "__reduce__", "__reduce_ex__",
                          "__instancecheck__", "__subclasscheck__"})
# Frame and code objects, reachable without a dunder (a generator's gi_frame.f_globals).
FRAME_PREFIXES = ("f_", "co_", "gi_", "cr_", "ag_", "tb_")
# What a chain may not reach through a module the stub gives (runtime.torch, decode_launch.runtime, ...).
GIVEN_DENIED = NEVER_IMPORT | {"torch", "triton", "tl", "F", "dist", "nn", "functional", "language", "np"} | {
    "address_check", "api", "backward", "context_parallel", "decode", "decode_launch", "fast", "forward", "grader",
    "impl", "integrity", "kv_cache", "lab", "launch", "layout", "naive", "online_softmax", "reference", "ring",
    "runtime", "testing", "tile_counts", "tiled", "traffic", "validation", "windows",
    # what the switch (impl, which windows.py's stub imports for impl.load) knows of the completed files
    "SOLUTIONS_DIR", "COMPLETED_PACKAGE", "completed_dir", "source_dir", "path_of",
}

HINTS = {
    "import": "{file} may import only {modules} and what its stub imports",
    "numpy": "numpy is not allowed in a graded file; use torch on the host and tl in kernels",
    "reflection": "eval, exec, compile, open, globals, vars, setattr, getattr with a computed name and the like "
                  "are not allowed; call what you need directly (rename a variable that shadows one)",
    "dunder": "attributes named like __this__ are not allowed; a class may define __init__ and the like, but not "
              "hooks such as __torch_function__ or __getattr__",
    "module-attribute": "the private and low-level parts of torch and triton (torch._C, torch.ops, torch.jit, "
                        "triton.runtime, ...), PyTorch's own attention, a module used as a value and changes to "
                        "a module are not allowed",
    "host-torch": "outside @triton.jit functions {file} may use torch only to allocate and describe tensors "
                  "(torch.empty, torch.float32, ...), and a kernel uses tl, never torch: compute in the kernel",
    "too-complex": "the file nests too deeply to be checked; simplify the expression",
    "annotation": "write annotations as expressions (x: torch.Tensor), never as strings, which a library may run",
}


@dataclass(frozen=True)
class Violation:
    """One refused construct: where it is, which rule refuses it and what was found."""

    file: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        modules = ", ".join(sorted(EXERCISES[self.file].imports if self.file in EXERCISES else ()))
        hint = HINTS.get(self.rule, "").format(file=self.file, modules=modules)
        return f"{self.file} line {self.line}: {self.detail} (rule {self.rule}: {hint})"


def check(name: str, source: str | bytes, stub: str | bytes | None = None) -> list[Violation]:
    """The violations of a graded file's source, in line order; empty when it passes the gate.

    Args:
        name: the graded file's name, e.g. ``"forward.py"`` (a path's last part is used).
        source: the file's text.
        stub: the text of the stub students received: its imports are allowed too (same module, any subset of
            its names). None: the exercise's table alone.

    Returns:
        The violations, sorted by line; ``[]`` for a file that does not parse (graded as its own failure
        elsewhere). Raises ValueError when ``name`` is not a graded file.
    """
    file = name.replace("\\", "/").rsplit("/", 1)[-1]
    if file not in EXERCISES:
        raise ValueError(f"{name!r} is not a graded file; expected one of {', '.join(sorted(EXERCISES))}")
    gate = _Gate(file, ast.parse(stub) if stub is not None else None)  # the stub is ours: it parses
    try:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return []
        gate.run(tree)
    except (RecursionError, MemoryError):  # fail closed: what cannot be read is not let through
        return [Violation(file, 1, "too-complex", "nesting too deep to check")]
    return sorted(set(gate.found), key=lambda v: (v.line, v.rule, v.detail))


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _chain(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """``a.b.c`` -> (the node ``a``, ["b", "c"])."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return node, attrs[::-1]


def _stub_imports(tree: ast.AST | None) -> tuple[set[str], dict[tuple[str, int], set[str]]]:
    """The stub's ``import X`` modules, and its ``from X import names`` by (module, level)."""
    plain: set[str] = set()
    froms: dict[tuple[str, int], set[str]] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            plain.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            froms.setdefault((node.module or "", node.level), set()).update(a.name for a in node.names)
    return plain, froms


class _Gate(ast.NodeVisitor):
    """One pass over one file's tree; ``found`` collects the violations."""

    def __init__(self, file: str, stub: ast.AST | None):
        exercise = EXERCISES[file]
        self.file, self.kernel, self.allowed = file, exercise.kernel, set(exercise.imports)
        self.allowed_paths = ALWAYS_ALLOWED_PATHS | self.allowed  # what it may import, it may use
        self.stub_plain, self.stub_from = _stub_imports(stub)
        self.bound: dict[str, str] = {}  # name bound by an import -> its dotted path
        self.modules: set[str] = set()  # those of them that are modules
        self.found: list[Violation] = []
        self.in_jit = self.in_class = False  # inside a @triton.jit function; directly in a class body

    def flag(self, node: ast.AST, rule: str, detail: str) -> None:
        self.found.append(Violation(self.file, getattr(node, "lineno", 1), rule, detail))

    def run(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):  # bindings first: a use may come before its import in the text
            if isinstance(node, ast.Import):
                for a in node.names:
                    local = a.asname or a.name.split(".")[0]  # `import a.b` binds a, `import a.b as x` a.b
                    self.bound[local] = a.name if a.asname else local
                    self.modules.add(local)
            elif isinstance(node, ast.ImportFrom):  # a relative import is from the package, gqa_flash
                package = ".".join(filter(None, ["gqa_flash" if node.level else "", node.module]))
                for a in node.names:
                    path = self.bound[a.asname or a.name] = f"{package}.{a.name}"
                    if package == "gqa_flash" or any(m == path or m.startswith(path + ".") for m in self.allowed):
                        self.modules.add(a.asname or a.name)
        self.visit(tree)

    # --- imports ---

    def _module_problem(self, module: str) -> tuple[str, str] | None:
        parts = module.split(".")
        if parts[0] == "numpy":
            return "numpy", f"imports {module}"
        if module != "__future__" and (any(p.startswith("_") for p in parts) or parts[0] in NEVER_IMPORT):
            return "import", f"imports {module}"
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            problem = self._module_problem(a.name)
            if problem is None and a.name not in self.allowed and a.name not in self.stub_plain:
                problem = "import", f"imports {a.name}"
            if problem:
                self.flag(node, *problem)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module, names = node.module or "", [a.name for a in node.names]
        where = "." * node.level + module
        if "*" in names:
            return self.flag(node, "import", f"imports * from {where}")
        stub_names = self.stub_from.get((module, node.level), set())
        extra = [n for n in names if n not in stub_names]
        if not extra:
            return None  # the stub's own import, or a subset of it
        problem = self._module_problem(module) if module else None
        if problem:
            return self.flag(node, *problem)
        allowed = self.allowed
        refused = [n for n in extra if node.level or (module not in allowed and f"{module}.{n}" not in allowed)]
        if refused:
            return self.flag(node, "import", f"imports {', '.join(refused)} from {where}")
        for n in extra:  # a name from a module is an attribute of it, under the same rules
            if not self._path(node, [*module.split("."), n], 0) and self.kernel and module == "torch" \
                    and n not in HOST_TORCH:
                self.flag(node, "host-torch", f"imports torch.{n}, which a launcher does not need")
        return None

    # --- attributes and names ---

    def _path(self, node: ast.AST, parts: list[str], start: int) -> bool:
        """Check the dotted path ``parts`` (a module, then attributes from ``start`` on); True if flagged."""
        denied = DENIED_ATTRIBUTES["*"] | DENIED_ATTRIBUTES.get(parts[0], frozenset())
        for i in range(1, len(parts)):
            name, prefix = parts[i], ".".join(parts[: i + 1])
            if prefix in self.allowed_paths or _dunder(name):  # dunders have a rule of their own
                continue
            if name in ("numpy", "from_numpy"):
                self.flag(node, "numpy", f"uses {prefix}")
            elif name.startswith("_") or name in denied or prefix in DENIED_PATHS or (
                    parts[0] == "gqa_flash" and i >= start and name in GIVEN_DENIED):
                self.flag(node, "module-attribute", f"uses {prefix}")
            else:
                continue
            return True
        return False

    def _attribute(self, node: ast.AST, base: ast.expr, attrs: list[str]) -> None:
        is_super = isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
        for i, a in enumerate(attrs):
            if _dunder(a) and not (is_super and i == 0 and a == "__init__"):
                return self.flag(node, "dunder", f"uses the attribute {a}")
            if a.startswith(FRAME_PREFIXES):
                return self.flag(node, "reflection", f"uses the attribute {a} (frame or code internals)")
        if isinstance(base, ast.Name) and base.id in self.bound:
            path = self.bound[base.id].split(".")
            if self._path(node, path + attrs, len(path)):
                return None
            full = path + attrs  # at least two parts: a module and an attribute
            if self.kernel and full[0] == "torch" and self.in_jit:
                self.flag(node, "host-torch", f"uses {'.'.join(full)} inside a @triton.jit function")
            elif self.kernel and full[0] == "torch" and (full[1] not in HOST_TORCH or HOST_METHODS & set(full[2:])):
                self.flag(node, "host-torch", f"uses {'.'.join(full)} on the host")
            return None
        if any(a in ("numpy", "from_numpy") for a in attrs) or isinstance(base, ast.Name) and base.id == "np":
            return self.flag(node, "numpy", "uses numpy")
        if self.kernel and not self.in_jit:
            hit = next((a for a in attrs if a in HOST_METHODS), None)
            if hit:
                self.flag(node, "host-torch", f"uses .{hit} on the host, outside a @triton.jit function")
        return None

    def _base(self, base: ast.expr) -> None:
        """Visit the object an attribute is read from (a module there is not 'used as a value')."""
        self.visit_Name(base, as_base=True) if isinstance(base, ast.Name) else self.visit(base)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base, attrs = _chain(node)
        if not isinstance(node.ctx, ast.Load) and isinstance(base, ast.Name) and base.id in self.bound:
            self.flag(node, "module-attribute", f"changes {self.bound[base.id]}.{'.'.join(attrs)}")
        self._attribute(node, base, attrs)
        self._base(base)

    def visit_Name(self, node: ast.Name, as_base: bool = False) -> None:
        name = node.id
        if name in REFLECTION_NAMES:
            self.flag(node, "reflection", f"uses {name}")
        elif name in ("getattr", "hasattr"):
            self.flag(node, "reflection", f"uses {name} other than as {name}(obj, \"name\")")
        elif _dunder(name) and name not in ALLOWED_DUNDER_NAMES:
            self.flag(node, "reflection", f"uses {name}")
        elif not as_base and name in self.modules and isinstance(node.ctx, ast.Load):
            self.flag(node, "module-attribute", f"uses the module {name} as a value; use its attributes")

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") and args:
            if len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str) \
                    and not any(isinstance(a, ast.Starred) for a in args):
                base, attrs = _chain(args[0])
                self._attribute(node, base, attrs + [args[1].value])  # a constant name: an attribute like any
            else:
                self.flag(node, "reflection", f"calls {func.id} with a computed attribute name")
            self._base(args[0])
            for child in args[1:] + [k.value for k in node.keywords]:
                self.visit(child)
            return None
        if isinstance(func, ast.Name) and func.id in CALL_ONLY_NAMES:
            self.flag(node, "reflection", f"calls {func.id}()")
        elif isinstance(func, ast.Name) and func.id == "type" and len(args) == 3:
            self.flag(node, "reflection", "makes a class with type(name, bases, namespace)")
        self.generic_visit(node)

    def _annotation(self, node: ast.expr | None) -> None:
        """An annotation written as a string is code the gate cannot read, which a library may evaluate."""
        if node is not None and any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in ast.walk(node)):
            self.flag(node, "annotation", "writes an annotation as a string")

    def visit_arg(self, node: ast.arg) -> None:
        self._annotation(node.annotation)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp | ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult) and self.kernel and not self.in_jit:
            self.flag(node, "host-torch", "multiplies matrices with @ on the host, outside a @triton.jit function")
        self.generic_visit(node)

    visit_AugAssign = visit_BinOp

    # --- definitions ---

    def _is_jit(self, decorator: ast.expr) -> bool:
        base, attrs = _chain(decorator.func if isinstance(decorator, ast.Call) else decorator)
        return isinstance(base, ast.Name) and ".".join([self.bound.get(base.id, "")] + attrs) == "triton.jit"

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if _dunder(node.name) and (not self.in_class or node.name in HOOK_METHODS):
            self.flag(node, "dunder", f"defines {node.name} {'in a class' if self.in_class else 'outside a class'}")
        for d in node.decorator_list:
            self.visit(d)
        saved = self.in_jit, self.in_class
        self.in_jit, self.in_class = self.in_jit or any(self._is_jit(d) for d in node.decorator_list), False
        self._annotation(node.returns)
        for child in [node.args, *node.body] + ([node.returns] if node.returns else []):
            self.visit(child)
        self.in_jit, self.in_class = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(k.arg == "metaclass" for k in node.keywords):
            self.flag(node, "reflection", f"gives class {node.name} a metaclass")
        for child in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(child)
        saved, self.in_class = self.in_class, True
        for child in node.body:
            self.visit(child)
        self.in_class = saved

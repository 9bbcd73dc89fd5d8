"""No function in the C++, CUDA and Python sources, tests included, is longer than 70 lines (the house
style: TigerBeetle's rule).

Why it matters: a function that fits on a screen can be read whole and checked by eye; past that,
reviews skim. The rule held by habit and drifted, so it is checked here mechanically.

A function's length is counted from the first line of its signature to the line of its closing
brace, both included. The scanner is a brace matcher over the source with comments, string and
character literals (raw strings too) and preprocessor lines taken out: every `{` at namespace,
class or `extern` scope whose header ends in a parameter list (and its qualifiers, trailing return
type or constructor initializers) opens a function; lambdas and local classes inside a function
count as part of it. Python's clang bindings (Debian's python3-clang) are not installed on the CI
machine, so this does not use them. A Python function is measured by its own parser (ast), from its
`def` line to its last line; a function nested in another counts as part of it, and on its own too.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(os.environ.get("CPKV_SOURCE_DIR", Path(__file__).resolve().parents[2]))
FOLDERS = ("model", "traces", "harness", "sim", "properties", "gpu", "kernels", "cli", "python/src", "bench", "examples", "fuzz",
           "tests")
# Every Python file of the project lives under one of these (the build folder, which holds copies, is not one).
PYTHON_FOLDERS = ("python", "bench", "scripts", "examples", "traces", "tests")
EXTENSIONS = {".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh"}
LINES_MAX = 70

# Functions still over the limit: (path, name) -> lines today. Each entry is a debt, not a licence:
# the test fails if one grows, and asks for the entry to go once it fits.
ALLOWED: dict[tuple[str, str], int] = {}


def strip_code(text: str) -> str:
    """The source with comments, literals and preprocessor lines blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            at_line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        j = skip_literal_or_comment(text, i)
        if j > i:
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def skip_literal_or_comment(text: str, i: int) -> int:
    """The end of the comment or literal starting at i, or i if none starts there."""
    if text.startswith("//", i):
        j = text.find("\n", i)
        return len(text) if j < 0 else j
    if text.startswith("/*", i):
        j = text.find("*/", i + 2)
        assert j >= 0, "an unterminated comment"
        return j + 2
    raw = re.match(r'(?:u8|u|U|L)?R"([^(\s]{0,16})\(', text[i:i + 24])
    if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
        end = text.find(")" + raw.group(1) + '"', i + raw.end())
        assert end >= 0, "an unterminated raw string"
        return end + len(raw.group(1)) + 2
    if text[i] == '"' or (text[i] == "'" and not digit_separator(text, i)):
        quote, j = text[i], i + 1
        while j < len(text) and text[j] != quote:
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


def digit_separator(text: str, i: int) -> bool:
    """A ' inside a number (1'000'000) rather than opening a character literal."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    return j < i and text[j].isdigit()


QUALIFIERS = re.compile(r"^(\s|const\b|noexcept\b|override\b|final\b|mutable\b|volatile\b|&)*$")


def top_level_groups(header: str) -> list[tuple[int, int]]:
    """(open, close) of each parenthesized group outside every other parenthesis and template
    argument list: the candidates for a function's parameter list."""
    groups, parens, angles, start = [], 0, 0, 0
    for k, c in enumerate(header):
        if c == "(":
            if parens == 0 and angles == 0:
                start = k
            parens += 1
        elif c == ")":
            parens -= 1
            if parens == 0 and angles == 0:
                groups.append((start, k))
        elif parens == 0 and c == "<" and not re.search(r"operator\s*<*$", header[:k]):
            angles += 1
        elif parens == 0 and c == ">" and angles > 0 and header[k - 1] != "-":
            angles -= 1
    return groups


def tail_kind(tail: str) -> str | None:
    """What follows a parameter list: 'plain' (qualifiers, a trailing return type), 'initializers'
    (a constructor's), or None (it was not the parameter list)."""
    tail = re.sub(r"noexcept\s*\([^)]*\)", " ", tail)
    tail = re.sub(r"\brequires\b.*$", " ", tail, flags=re.S)
    if re.match(r"^(\s|const\b|noexcept\b)*:(?!:)", tail):
        return "initializers"
    tail = re.sub(r"->.*$", " ", tail, flags=re.S)
    return "plain" if QUALIFIERS.match(tail) else None


def parameter_list(header: str) -> tuple[tuple[int, int], str] | None:
    """The group that is the parameter list (the last one whose tail is a function's) and its tail kind."""
    for open_, close in reversed(top_level_groups(header)):
        kind = tail_kind(header[close + 1:])
        if kind is not None:
            return (open_, close), kind
    return None


def blank_groups(header: str) -> str:
    """The header with its parenthesized groups and template argument lists blanked."""
    out = list(header)
    for open_, close in top_level_groups(header):
        out[open_:close + 1] = " " * (close + 1 - open_)
    return re.sub(r"<[^<>;{}]*>", " ", "".join(out))


def kind_of(header: str) -> str:
    """scope (namespace, class, extern), function, or other (an initializer, an enum)."""
    words = re.sub(r"^\s*template\s*<[^{;]*?>\s*", "", header).split()
    if not words:
        return "other"
    if words[0] in ("namespace", "extern", "class", "struct", "union") or words[:2] == ["inline", "namespace"]:
        return "scope"
    if words[0] == "enum":
        return "other"
    if re.search(r"(?<![=!<>+\-*/%&|^])=(?!=)", blank_groups(header)) and "operator" not in header:
        return "other"  # an initializer: `kTable[] = {`
    return "function" if parameter_list(header) is not None else "other"


def is_member_brace_init(header: str) -> bool:
    """`Foo(int x) : a_(x), b_{` : the brace of a member's braced initializer, not the body."""
    found = parameter_list(header)
    if found is None or found[1] != "initializers":
        return False
    return bool(re.search(r"[A-Za-z0-9_>]\s*$", header))


def function_name(header: str) -> str:
    found = parameter_list(header)
    before = header[: found[0][0]] if found else header
    operator = re.search(r"(operator\s*(\(\)|[^\s(]+))\s*$", before)
    if operator:
        return operator.group(1)
    names = re.findall(r"[A-Za-z_~][A-Za-z0-9_:~]*", before)
    name = names[-1] if names else "?"
    if re.fullmatch(r"[A-Z][A-Z0-9_]{2,}", name):  # a macro (TEST, PYBIND11_MODULE): its arguments name it
        return name + header[found[0][0]:found[0][1] + 1] if found else name
    return name


def functions(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function defined in the file."""
    code = strip_code(path.read_text(errors="replace"))
    found: list[tuple[str, int, int]] = []
    scopes: list[str] = []  # the kinds of the open braces: scope, function, init, inner, other
    header_start = 0        # where the current scope-level header begins
    open_function: tuple[str, int] | None = None
    for k, c in enumerate(code):
        in_scope = not scopes or scopes[-1] == "scope"
        if c == ";" and in_scope:
            header_start = k + 1
        elif c == "{":
            if not in_scope:
                scopes.append("inner" if scopes[-1] != "init" else "init")
                continue
            header = code[header_start:k]
            if is_member_brace_init(header):
                scopes.append("init")
                continue
            kind = kind_of(header)
            scopes.append(kind)
            if kind == "function":
                first = header_start + len(header) - len(header.lstrip())
                open_function = (function_name(" ".join(header.split())), code.count("\n", 0, first) + 1)
        elif c == "}":
            assert scopes, f"{path}:{code.count(chr(10), 0, k) + 1}: an unmatched }}"
            kind = scopes.pop()
            if kind == "function" and open_function is not None:
                name, first_line = open_function
                found.append((name, first_line, code.count("\n", 0, k) + 1 - first_line + 1))
                open_function = None
            if kind != "init" and (not scopes or scopes[-1] == "scope"):
                header_start = k + 1
        if c == "{" and scopes and scopes[-1] == "scope":
            header_start = k + 1
    assert not scopes, f"{path}: {len(scopes)} unclosed braces at the end of the file"
    return found


def sources() -> list[Path]:
    files = []
    for folder in FOLDERS:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in EXTENSIONS and p.is_file()]
    return files


def test_the_scanner_finds_functions_and_only_functions(tmp_path):
    sample = tmp_path / "sample.cpp"
    sample.write_text(
        '#define X(a) { a }\n'
        'namespace n {\n'
        'struct S : B {\n'
        '  S(int x) : a_(x), b_{x} {\n'
        '    const char* s = "}{";\n'
        '  }\n'
        '  int f() const noexcept { return \'}\'; }\n'
        '  int a_, b_;\n'
        '};\n'
        'inline constexpr int kTable[] = {1, 2};\n'
        'auto g(int n) -> int {\n'
        '  auto l = [&](int m) { return m + 1\'000; };  // }\n'
        '  /* { */ return l(n);\n'
        '}\n'
        'TEST(Suite, Name) {\n'
        '}\n'
        '}  // namespace n\n')
    assert functions(sample) == [("S", 4, 3), ("f", 7, 1), ("g", 11, 4), ("TEST(Suite, Name)", 15, 2)]
    # A function of 71 lines, signature to closing brace, is measured as 71 (one over the limit).
    body = "".join(f"  x += {i};\n" for i in range(68))
    sample.write_text(f"namespace {{\nint h(int x)\n{{\n{body}}}\n}}\n")
    assert functions(sample) == [("h", 2, 71)]


def test_no_function_is_longer_than_70_lines():
    too_long, grown = [], []
    seen = set()
    for path in sources():
        relative = str(path.relative_to(ROOT))
        for name, first_line, lines in functions(path):
            key = (relative, name)
            if key in ALLOWED:
                seen.add(key)
                if lines > ALLOWED[key]:
                    grown.append(f"{relative}:{first_line}: {name} is {lines} lines (allowed {ALLOWED[key]} until it is split)")
                continue
            if lines > LINES_MAX:
                too_long.append(f"{relative}:{first_line}: {name} is {lines} lines")
    fixed = [f"{path}: {name}" for (path, name) in ALLOWED if (path, name) not in seen]
    assert not too_long, f"functions over {LINES_MAX} lines:\n" + "\n".join(too_long)
    assert not grown, "allowed functions that grew:\n" + "\n".join(grown)
    assert not fixed, "allow-list entries that name no function (remove them):\n" + "\n".join(fixed)


def python_functions(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function and method in a Python file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_python_scanner_measures_a_function_from_its_def_to_its_last_line(tmp_path):
    sample = tmp_path / "sample.py"
    body = "".join(f"    x += {i}\n" for i in range(69))
    sample.write_text(f"import os\n\n\ndef h(x):\n{body}    return x\n\n\nclass C:\n    def m(self):\n        pass\n")
    assert python_functions(sample) == [("h", 4, 71), ("m", 78, 2)]  # 69 + def + return: 71, one over the limit


def test_no_python_function_is_longer_than_70_lines():
    files = [p for folder in PYTHON_FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if "__pycache__" not in p.parts]
    assert len(files) > 50, f"too few Python files under {PYTHON_FOLDERS}: {len(files)}"
    too_long = [f"{p.relative_to(ROOT)}:{first}: {name} is {lines} lines"
                for p in files for name, first, lines in python_functions(p) if lines > LINES_MAX]
    assert not too_long, f"functions over {LINES_MAX} lines:\n" + "\n".join(too_long)

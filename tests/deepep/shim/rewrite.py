"""Every `assert` of a DeepEP test file becomes a call of the check counter (checks.py),
in place: the statement's text is replaced by

    __epx_check__(lambda: (<test>), lambda: (<message>) | None, "<file>", <line>, "<test text>")

spanning the same lines, so every other line keeps DeepEP's line number (a traceback
points at DeepEP's source). Only the temporary copy is rewritten."""
import ast

CHECK = "__epx_check__"
IMPORT = f"from epx_deepep_shim.checks import check as {CHECK}"


def _offsets(src):
    """Byte offset of the start of every line (ast columns are UTF-8 byte offsets)."""
    starts, pos = [0], 0
    for line in src.encode().splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def rewrite(src, filename):
    """(new source, number of asserts rewritten)."""
    tree = ast.parse(src, filename)
    data = src.encode()
    starts = _offsets(src)

    def span(node):
        return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset

    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    edits = []
    for node in asserts:
        a, b = span(node)
        ta, tb = span(node.test)
        test = data[ta:tb].decode()
        msg = "None"
        if node.msg is not None:
            ma, mb = span(node.msg)
            msg = "lambda: (" + data[ma:mb].decode() + ")"
        one_line = " ".join(test.split())
        text = f"{CHECK}(lambda: ({test}), {msg}, {filename!r}, {node.lineno}, {one_line!r}"
        missing = data[a:b].count(b"\n") - text.count("\n")
        text += "\n" * max(0, missing) + ")"
        edits.append((a, b, text.encode()))
    for a, b, text in sorted(edits, reverse=True):
        data = data[:a] + text + data[b:]
    out = data.decode()
    # the import goes on line 1 (after a __future__ import it would be an error; DeepEP's
    # tests have none), joined with `;` so no line moves
    lines = out.split("\n")
    if any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body):
        raise ValueError(f"{filename}: a __future__ import; the check import cannot go first")
    lines[0] = IMPORT + "; " + lines[0] if lines[0].strip() else IMPORT
    out = "\n".join(lines)
    ast.parse(out, filename)
    if out.count("\n") != src.count("\n"):
        raise AssertionError(f"{filename}: the rewrite moved lines ({src.count(chr(10))} -> {out.count(chr(10))})")
    return out, len(asserts)

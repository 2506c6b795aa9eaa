"""Reviewed-profile analysis of one Python function (formation-consistent dispatch).

Reads a JSON request on stdin: {"analysis": ..., "source": PATH, "function": NAME,
"argument": NAME, "sink": DOTTED, "callees": [DOTTED...]} and prints one JSON object:
{"status": "registered", "facts": {...}} or {"status": "rejected", "reason": ...}.

Only the AST is read (comments and strings never create facts). Analyses:

- dash_guarded_sink: one top-level function; `argument` flows unchanged (never
  reassigned) as a direct positional argument into exactly one call of `sink`, which is a
  top-level statement of the body; every callee is in the reviewed `callees` list. Fact:
  whether a top-level `if ARG.startswith("-"): raise ...` precedes the sink statement.
- bool_default_flow: one top-level function; `argument` is a parameter, never
  reassigned, with a literal bool default, or a None default and one top-level parser
  `V = <bool> if ARG is None else ARG` (V assigned once); the value (ARG or V) appears
  inside the arguments of exactly one call of `sink`. Fact: the default.
"""

import ast
import json
import sys


def dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def assigned_names(fn):
    out = set()
    for node in ast.walk(fn):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, ast.NamedExpr):
            targets = [node.target]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    out.add(n.id)
    return out


def unique_function(tree, name):
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if len(found) != 1:
        raise Reject(f"expected one top-level function {name}, found {len(found)}")
    return found[0]


def params(fn):
    a = fn.args
    return a.posonlyargs + a.args + a.kwonlyargs


class Reject(Exception):
    pass


def is_dash_guard(stmt, arg):
    if not isinstance(stmt, ast.If) or stmt.orelse:
        return False
    t = stmt.test
    ok = (
        isinstance(t, ast.Call)
        and dotted(t.func) == f"{arg}.startswith"
        and len(t.args) == 1
        and not t.keywords
        and isinstance(t.args[0], ast.Constant)
        and t.args[0].value == "-"
    )
    return ok and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Raise)


def dash_guarded_sink(req, fn):
    arg = req["argument"]
    if arg not in [p.arg for p in params(fn)]:
        raise Reject(f"{fn.name} has no parameter {arg}")
    if arg in assigned_names(fn):
        raise Reject(f"{arg} is reassigned in {fn.name}: no direct flow")
    callees = sorted({dotted(n.func) or "<dynamic>" for n in ast.walk(fn) if isinstance(n, ast.Call)})
    unknown = [c for c in callees if c not in req["callees"]]
    if unknown:
        raise Reject(f"callees outside the reviewed inventory: {unknown}")
    sinks = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and dotted(n.func) == req["sink"]]
    if len(sinks) != 1:
        raise Reject(f"expected one {req['sink']} sink, found {len(sinks)}")
    sink = sinks[0]
    if not any(isinstance(a, ast.Name) and a.id == arg for a in sink.args):
        raise Reject(f"{arg} does not flow directly into {req['sink']}")
    if any(isinstance(a, ast.Starred) for a in sink.args) or sink.keywords:
        raise Reject(f"{req['sink']} takes starred or keyword arguments")
    at = None
    for i, stmt in enumerate(fn.body):
        if sink in [n for n in ast.walk(stmt)]:
            direct = (isinstance(stmt, (ast.Return, ast.Expr)) and stmt.value is sink) or (
                isinstance(stmt, ast.Assign) and stmt.value is sink
            )
            if not direct:
                raise Reject(f"{req['sink']} is not a top-level statement of {fn.name}")
            at = i
    guard = any(is_dash_guard(s, arg) for s in fn.body[:at])
    return {"sink": req["sink"], "dash_rejection_before_sink": guard, "callees": callees}


def assignment_count(fn, name):
    n = 0
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            n += sum(1 for t in node.targets for x in ast.walk(t) if isinstance(x, ast.Name) and x.id == name)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.For, ast.AsyncFor)):
            n += sum(1 for x in ast.walk(node.target) if isinstance(x, ast.Name) and x.id == name)
    return n


def none_default_parser(fn, arg):
    """`V = <bool> if ARG is None else ARG` as a top-level statement: (V, bool) or None."""
    found = []
    for stmt in fn.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        v = stmt.value
        ok = (
            isinstance(v, ast.IfExp)
            and isinstance(v.test, ast.Compare)
            and isinstance(v.test.left, ast.Name)
            and v.test.left.id == arg
            and len(v.test.ops) == 1
            and isinstance(v.test.ops[0], ast.Is)
            and isinstance(v.test.comparators[0], ast.Constant)
            and v.test.comparators[0].value is None
            and isinstance(v.body, ast.Constant)
            and isinstance(v.body.value, bool)
            and isinstance(v.orelse, ast.Name)
            and v.orelse.id == arg
        )
        if ok:
            found.append((stmt.targets[0].id, v.body.value))
    return found[0] if len(found) == 1 else None


def bool_default_flow(req, fn):
    arg = req["argument"]
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = dict(zip([p.arg for p in positional][len(positional) - len(a.defaults):], a.defaults))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    d = defaults.get(arg)
    if arg in assigned_names(fn):
        raise Reject(f"{arg} is reassigned in {fn.name}: no direct flow")
    if isinstance(d, ast.Constant) and isinstance(d.value, bool):
        flow, default = arg, d.value
    elif isinstance(d, ast.Constant) and d.value is None:
        parsed = none_default_parser(fn, arg)
        if parsed is None:
            raise Reject(f"{arg} defaults to None without one `V = <bool> if {arg} is None else {arg}` parser")
        flow, default = parsed
        if assignment_count(fn, flow) != 1:
            raise Reject(f"{flow} is assigned more than once in {fn.name}")
    else:
        raise Reject(f"{arg} has no literal bool or None default")
    sinks = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and dotted(n.func) == req["sink"]]
    if len(sinks) != 1:
        raise Reject(f"expected one {req['sink']} sink, found {len(sinks)}")
    if not any(isinstance(n, ast.Name) and n.id == flow for n in ast.walk(sinks[0])):
        raise Reject(f"{arg} does not reach {req['sink']}")
    return {"sink": req["sink"], "default": default}


def main():
    req = json.load(sys.stdin)
    try:
        with open(req["source"], encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=req["source"])
        fn = unique_function(tree, req["function"])
        analysis = {"dash_guarded_sink": dash_guarded_sink, "bool_default_flow": bool_default_flow}.get(req["analysis"])
        if analysis is None:
            raise Reject(f"unknown analysis {req['analysis']!r}")
        out = {"status": "registered", "facts": analysis(req, fn)}
    except (Reject, SyntaxError, OSError) as e:
        out = {"status": "rejected", "reason": str(e)}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()

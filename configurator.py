"""
Applies config files and --key=value flags to a script's config globals, e.g.

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=False

Arguments are applied left to right. A config file is plain Python whose top-level assignments
override the defaults; a flag's value is read as a Python literal, else taken as a string.
Unknown keys and wrong types are errors (an int is fine where a float is expected), because a
typo that silently creates a new setting costs a whole run.

A setting's valid values are declared once, at the end of the comment beside it, as a Python condition
in brackets that may name other settings, e.g.

    min_lr = 6e-5  # floor of the schedule [0 <= min_lr <= learning_rate]

configure() checks every such rule, in the order of the script, before the script touches a file (train.py
checks a resume's once the run's own settings are read from its checkpoint), and --help shows them with the
comments. A number setting whose rule names 'auto', such as
`batch_size = 12  # ... [batch_size == 'auto' or batch_size > 0]`, also takes the string 'auto'.
"""
import ast
import difflib
import io
import math
import os
import re
import sys
import tokenize
import traceback
import types

from common import UserError


def config_keys(scope: dict) -> dict:
    """The config settings among a module's globals: public names bound to int, float, bool or str, but not
    constants (upper case, such as one imported from common)."""
    return {k: v for k, v in scope.items()
            if not (k.startswith("_") or k.isupper()) and type(v) in (int, float, bool, str)}


def _checked(key: str, value, defaults: dict, source: str, autos=()):
    """value for the setting key, checked against the defaults' keys and its default's type (not the type of what
    an earlier file or flag set: --batch_size=auto --batch_size=12 is fine); the settings in `autos` also take
    the string 'auto' (their rules say what it means)."""
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else "; see --help for the keys" + (
            " (a name of the file's own starts with _)" if source.startswith("config file") else "")
        raise UserError(f"unknown config key '{key}' in {source}{hint}")
    default = defaults[key]
    if type(default) is float and type(value) is int:
        if abs(value) > 2 ** 1023:
            raise UserError(f"config key '{key}' in {source} is too large for a float: got {len(str(abs(value)))} "
                            "digits")
        return float(value)
    if type(default) is float and isinstance(value, float):  # numpy's float64 is a float
        return float(value)
    if key in autos and value == "auto":
        return value
    if type(value) is not type(default):
        kind = type(default).__name__ + (" or 'auto'" if key in autos else "") + (", True or False" if type(default)
                                                                                  is bool else "")
        raise UserError(f"config key '{key}' in {source} must be {kind} (default {default!r}), got {value!r}")
    return value


def parse_value(raw: str, default):
    """A flag's value as a Python literal ('3e-4', 'True', "'x'"), else as the raw string.
    Where the default is a string, the raw text is kept unless it is a quoted string."""
    if isinstance(default, float) and raw.strip().lower().lstrip("+-") in ("inf", "nan"):
        return float(raw)  # no literal, but a float all the same: the setting's rule then says what is wrong
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):  # the last two: a pathologically nested literal
        return raw
    if isinstance(default, str) and not isinstance(value, str):
        return raw  # --wandb_run_name=2024 is the name "2024"
    return value


def run_statements(body: list):
    """The statements of a file that run when it is loaded: those of its blocks (if, for, with, try, match), not
    of the functions and classes it defines."""
    for node in body:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for block in [getattr(node, field, []) for field in ("body", "orelse", "finalbody")] + \
                    [part.body for part in getattr(node, "handlers", []) + getattr(node, "cases", [])]:
                yield from run_statements(block)


class Namespace(dict):
    """A config file's namespace that records the names its statements assign as they run (a branch not taken
    assigns nothing), and those they read before assigning them (learning_rate = learning_rate * 2 builds on the
    value before the file): exec stores and looks up a module's names through __setitem__ and __getitem__ where
    the namespace is not a plain dict."""

    def __init__(self, *args):
        super().__init__(*args)
        self.assigned, self.read_first = set(), set()

    def __setitem__(self, key, value):
        self.assigned.add(key)
        super().__setitem__(key, value)

    def __getitem__(self, key):
        if key not in self.assigned:
            self.read_first.add(key)
        return super().__getitem__(key)


def apply_file(path: str, config: dict, ignored=(), autos=(), defaults: dict | None = None,
               given: set | None = None, built_on: set | None = None) -> dict:
    """Run a config file with the current settings (config) in scope and return the settings it changed, typed
    as `defaults` (None: config itself); keys in `ignored` are accepted and dropped, keys in `autos` may be 'auto'.
    given: a set to add the settings the file assigned to, whatever their value (see configure). built_on: a set to
    add the settings the file read before it assigned them (their earlier value went into its own)."""
    if os.path.isdir(path):
        run = f"; for the run in it, pass --out_dir={path}" if "out_dir" in config else ""
        raise UserError(f"'{path}' is a folder, not a config file: settings are given as --key=value{run}")
    if not os.path.isfile(path):
        if "=" in path and path.split("=", 1)[0].isidentifier():  # a setting without its dashes
            raise UserError(f"'{path}' is not a config file: give settings with their dashes, --{path}")
        raise UserError(f"config file '{path}' not found: give a path such as config/train_shakespeare_char.py")
    kind = os.path.splitext(path)[1].lower()
    if kind in (".pt", ".pth", ".safetensors"):
        raise UserError(f"'{path}' is a model's weights, not a config file: train.py, sample.py, eval.py and export.py "
                        f"take it as --init_from={path}")
    if kind in (".json", ".yaml", ".yml", ".toml"):
        raise UserError(f"config file '{path}' is {kind[1:].upper()}: config files are Python, one `key = value` "
                        "per line (see config/)")
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark, as some editors write, is no character
            source = f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"config file '{path}' is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise UserError(f"config file '{path}' cannot be read ({e.strerror or e}): check its permissions") from None
    try:
        tree = ast.parse(source, path)  # compiled, and read for the names it imports
        code = compile(tree, path, "exec")
    except SyntaxError as e:
        raise UserError(f"config file '{path}' line {e.lineno}: syntax error: {e.msg}") from None
    if all(isinstance(node, ast.Pass) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
           for node in tree.body):  # saved empty, or every line commented out: the defaults would run unsaid
        raise UserError(f"config file '{path}' sets nothing (it has no `key = value` line): write the settings in "
                        "it, or leave it out to run on the defaults")
    for node in run_statements(tree.body):  # `batch_size: 4` and `batch_size == 4` are Python too, and set nothing
        if (isinstance(node, ast.AnnAssign) and node.value is None) or (isinstance(node, ast.Expr) and not (
                isinstance(node.value, (ast.Constant, ast.JoinedStr))
                or any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom))
                       for n in ast.walk(node.value)))):
            raise UserError(f"config file '{path}' line {node.lineno}: {ast.get_source_segment(source, node)!r} "
                            "sets nothing: a setting is `key = value`")
    scope = Namespace(config)
    try:
        exec(code, scope)
    except Exception as e:  # a config file is user code: whatever it raises is the user's to fix
        line = next((frame.lineno for frame in reversed(traceback.extract_tb(e.__traceback__))
                     if frame.filename == path), "?")
        raise UserError(f"config file '{path}' line {line} raised {e.__class__.__name__}: {e}") from None
    imported = set()
    for node in ast.walk(tree):
        for alias in node.names if isinstance(node, (ast.Import, ast.ImportFrom)) else ():
            if alias.name == "*":  # from math import *: the module's public names, which exec has imported
                names = vars(sys.modules[node.module]) if node.module in sys.modules else {}
                imported |= set(names.get("__all__") or (n for n in names if not n.startswith("_")))
            else:
                imported.add(alias.asname or alias.name.split(".")[0])
    settings = {key: value for key, value in scope.items() if not (
        key.startswith("_") or isinstance(value, types.ModuleType) or callable(value) or key in ignored
        or (key in imported and key not in config))}  # imports (from math import sqrt, pi), helpers and private
    known = defaults or config  # names are the file's own business
    unknown = [key for key in settings if key not in known]
    helpers = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if sum(key not in helpers and not difflib.get_close_matches(key, known, n=1) for key in unknown) >= 3:
        # not typos (those get the closest key, below), but several names unlike any of this script's: a config file
        # of another script, such as train.py's given to sample.py, whose out_dir (if it names one) this one wants, or
        # the model an evaluation config evaluates (a finetune's init_from is where it starts, not its result)
        named = {k: scope.get(k) if k in scope.assigned and k in config else None for k in ("init_from", "out_dir")}
        evaluated = scope.get("eval_only") is True and named["init_from"] not in (None, "scratch", "resume")
        hint = f"; for the model it evaluates, pass --init_from={named['init_from']}" if evaluated else \
            f"; for the out_dir it names, pass --out_dir={named['out_dir']}" if isinstance(named["out_dir"], str) else ""
        raise UserError(f"config file '{path}' sets {len(unknown)} settings this script does not have ("
                        f"{', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}): it reads as another script's "
                        f"config{hint}; see --help for this one's settings")
    for key in unknown:  # one the file reads itself (n = 4; n_layer = n) is a helper, not a misspelt setting
        if key in helpers and not difflib.get_close_matches(key, known, n=1):
            raise UserError(f"unknown config key '{key}' in config file '{path}': a name the file only uses itself "
                            f"must start with _ (_{key}), as names that do are not settings")
    if given is not None:
        given |= scope.assigned & set(settings)
    if built_on is not None:
        built_on |= scope.read_first & scope.assigned & set(settings)
    return {key: _checked(key, value, defaults or config, f"config file '{path}'", autos)
            for key, value in settings.items() if key not in config or value is not config[key]}


def configure(config: dict, argv: list[str], script: str | None = None, ignored=(), check: bool = True,
              given: set | None = None, quiet: bool = False, types: dict | None = None) -> dict:
    """Return a copy of config with the config files and --key=value flags in argv applied in order, then
    check the rules of `script`'s settings (unless not `check`: a first reading whose result picks the
    defaults of the real one, or a script that checks them itself once it knows every setting's value). Keys in
    `ignored` (another script's settings that this one has no use for) are accepted and dropped. With --help (or
    -h) in argv, print the settings of `script` (see describe) and exit.
    given: a set to add the settings that argv sets explicitly to, a value equal to the default included (a
    choice, e.g. --pos_emb=learned against a checkpoint trained with rope): its flags, and what its config files
    assign as they run. quiet: no warnings (a first reading, where the real one gives them). types: the
    script's defaults, whose types values must have, where config holds others (batch_size='auto')."""
    if script is not None and ("--help" in argv or "-h" in argv):
        print(describe(script, config))
        sys.exit(0)
    defaults, config = types or config, dict(config)
    setting_rules = rules(script, config) if script is not None else {}
    autos = {k for k, rule in setting_rules.items() if "'auto'" in rule and type(defaults[k]) is not str}
    flags, lost = {}, {}  # key: the flag that set it; and, of those, the ones a later config file set otherwise
    for arg in argv:
        if not arg.startswith("--"):
            built_on = set()  # a flag that the file's own value builds on is not lost
            assigned = apply_file(arg, config, ignored, autos, defaults, given, built_on)
            lost |= {k: (flags.pop(k), arg) for k, v in assigned.items()
                     if k in flags and v != config[k] and k not in built_on}
            config.update(assigned)
            continue
        key, sep, raw = arg[2:].partition("=")  # split on the first '=' only: --wandb_run_name=lr=3e-4
        if not sep:
            raise UserError(f"flag '{arg}' has no value: write --{key}=VALUE")
        if key in ignored:
            continue
        config[key] = _checked(key, parse_value(raw, defaults.get(key)), defaults, f"flag '{arg}'", autos)
        flags[key] = arg
        lost.pop(key, None)  # given again after the file: it wins
        if given is not None:
            given.add(key)
    # in order, as nanoGPT reads them, but a flag typed and then lost is a slip; said once (rank 0, under torchrun)
    if lost and not quiet and os.environ.get("RANK", "0") == "0":
        print("warning: " + "; ".join(f"config file {path} sets {k} over {flag} before it" for k, (flag, path)
                                      in lost.items()) + ": put flags after the config file for them to win",
              file=sys.stderr)
    if check:
        check_rules(config, setting_rules, given)
    return config


RULE = re.compile(r"\[([^\[\]]+)\]$")  # a condition in brackets at the very end of a setting's comment


def settings_in_source(path: str, config: dict) -> list[tuple[str, str, str]]:
    """(section heading, setting name, its comment) for each setting assigned at the top of the script at
    path, in source order; the headings come from `# ---- section` banners."""
    with open(path, encoding="utf-8") as f:
        tokens = list(tokenize.generate_tokens(io.StringIO(f.read()).readline))
    comments = {tok.start[0]: tok.string.lstrip("#").strip() for tok in tokens if tok.type == tokenize.COMMENT}
    found, heading = [], ""
    for i, tok in enumerate(tokens):
        row, col = tok.start
        text = comments.get(row, "")
        if tok.type == tokenize.COMMENT and col == 0 and text.startswith("----") and text.strip("- "):
            heading = text.strip("- ")
        elif (tok.type == tokenize.NAME and col == 0 and tok.string in config
              and i + 1 < len(tokens) and tokens[i + 1].string == "="):
            found.append((heading, tok.string, text))
    return found


def rules(path: str, config: dict) -> dict[str, str]:
    """Each setting's rule (the bracketed condition ending its comment) in the script at path."""
    return {name: match.group(1) for _, name, comment in settings_in_source(path, config)
            if (match := RULE.search(comment))}


def check_rules(config: dict, setting_rules: dict[str, str], given: set | None = None):
    """A UserError for the first setting whose rule is false (or cannot be evaluated) with these settings.
    `inf` may appear in a rule; NaN fails every comparison, so `0 < x < inf` also means finite. given (see
    configure): when the setting was not given, but a setting its rule reads was, the error says to give it too."""
    for name, rule in setting_rules.items():
        try:
            ok = eval(compile(rule, f"rule of {name}", "eval"), {"__builtins__": {}, "inf": math.inf}, dict(config))
        except Exception:  # e.g. n_embd % n_head with n_head 0: the rule cannot hold
            ok = False
        if not ok and config[name] == "" and rule.replace('"', "'") == f"{name} != ''":  # a setting to give
            raise UserError(f"{name} is empty: give --{name}=...")
        if not ok:
            others = [f"{k}={config[k]!r}" for k in config if k != name and re.search(rf"\b{k}\b", rule)]
            with_others = f" (with {', '.join(others)})" if others else ""
            defaulted = given is not None and name not in given and any(k in given for k in config
                                                                          if re.search(rf"\b{k}\b", rule))
            raise UserError(f"{name}={config[name]!r} is not valid: {name} must satisfy {rule}{with_others}"
                            + (f"; {name} was not given, so it kept its default: give --{name} as well"
                               if defaulted else ""))


def describe(path: str, config: dict) -> str:
    """--help text: every setting with its default and the comment beside it (rule included) in the script
    at path, under the `# ---- section` banners that group them there; the defaults, not what the command's own
    config files and flags make of them."""
    usage = f"usage: python {os.path.basename(path)} [config_file.py ...] [--key=value ...]"
    lines, last_heading = [usage, "the settings and their defaults (config files and flags, in order, change them):"], ""
    for heading, name, comment in settings_in_source(path, config):
        if heading != last_heading:
            lines.append(f"\n{heading}:")
            last_heading = heading
        lines.append(f"  --{name}={config[name]!r}".ljust(40) + (f"  {comment}" if comment else ""))
    return "\n".join(lines)

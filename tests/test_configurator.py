import os

import pytest

from configurator import UserError, check_rules, configure, describe, rules
from conftest import run_script

DEFAULTS = {"batch_size": 12, "learning_rate": 6e-4, "compile": True, "wandb_run_name": "gpt2", "out_dir": "out"}


def test_flags_are_parsed_as_literals():
    config = configure(DEFAULTS, ["--batch_size=32", "--compile=False", "--out_dir=out-x"])
    assert config["batch_size"] == 32 and config["compile"] is False and config["out_dir"] == "out-x"
    assert DEFAULTS["batch_size"] == 12  # the defaults are not modified


def test_int_is_accepted_where_a_float_is_expected():
    config = configure(DEFAULTS, ["--learning_rate=1"])
    assert config["learning_rate"] == 1.0 and type(config["learning_rate"]) is float


def test_unknown_key_names_the_closest_known_key():
    with pytest.raises(UserError, match="unknown config key 'batchsize'.*did you mean 'batch_size'"):
        configure(DEFAULTS, ["--batchsize=4"])


def test_wrong_type_is_an_error():
    with pytest.raises(UserError, match="'batch_size' .* must be int"):
        configure(DEFAULTS, ["--batch_size=3.5"])
    with pytest.raises(UserError, match="'compile' .* must be bool, True or False"):
        configure(DEFAULTS, ["--compile=yes"])
    # inf and nan are floats, though no literals: the rules judge them (0 < learning_rate < inf), not the type check
    assert configure(DEFAULTS, ["--learning_rate=inf"])["learning_rate"] == float("inf")
    assert configure(DEFAULTS, ["--learning_rate=-inf"])["learning_rate"] == float("-inf")


def test_a_later_number_replaces_an_earlier_auto(tmp_path):
    import train
    auto = tmp_path / "auto.py"
    auto.write_text("batch_size = 'auto'\n")
    for argv in (["--batch_size=auto", "--batch_size=12"], [str(auto), "--batch_size=12"]):
        assert configure(train.config_defaults, argv, train.__file__)["batch_size"] == 12
    with pytest.raises(UserError, match=r"'batch_size' .* must be int or 'auto' \(default 12\), got 'max'"):
        configure(train.config_defaults, ["--batch_size=auto", "--batch_size=max"], train.__file__)


def test_a_config_file_may_import_builtin_functions(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("from math import sqrt, pi\nbatch_size = int(sqrt(16))\nlearning_rate = pi / 1e4\n")
    config = configure(DEFAULTS, [str(path)])
    assert config["batch_size"] == 4 and config["learning_rate"] == pytest.approx(3.14159e-4)


def test_a_number_too_large_for_a_float_is_an_error():
    with pytest.raises(UserError, match="'learning_rate' .* is too large for a float: got 401 digits"):
        configure(DEFAULTS, ["--learning_rate=1" + "0" * 400])


def test_value_containing_equals_splits_on_the_first_only():
    config = configure(DEFAULTS, ["--wandb_run_name=lr=3e-4"])
    assert config["wandb_run_name"] == "lr=3e-4"


def test_numeric_looking_string_stays_a_string():
    assert configure(DEFAULTS, ["--wandb_run_name=2024"])["wandb_run_name"] == "2024"


def test_flag_without_value_is_an_error():
    with pytest.raises(UserError, match="has no value"):
        configure(DEFAULTS, ["--compile"])


def test_config_file_then_flag_in_order(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text("import math\nbatch_size = 64\nlearning_rate = batch_size * 1e-5\n_scratch = 3\n")
    config = configure(DEFAULTS, [str(path), "--batch_size=8"])
    assert config["batch_size"] == 8 and config["learning_rate"] == pytest.approx(64e-5)


def test_a_flag_before_a_config_file_that_sets_it_again_is_warned_of(tmp_path, capsys):
    path = tmp_path / "exp.py"
    path.write_text("batch_size = 64\nout_dir = 'out'\n")
    config = configure(DEFAULTS, ["--batch_size=8", "--out_dir=out", "--compile=False", str(path)])
    assert config["batch_size"] == 64 and config["compile"] is False  # in order, as nanoGPT reads them
    assert capsys.readouterr().err == (f"warning: config file {path} sets batch_size over --batch_size=8 before it: "
                                       "put flags after the config file for them to win\n")  # out_dir: the same value
    configure(DEFAULTS, [str(path), "--batch_size=8"])
    assert capsys.readouterr().err == ""
    configure(DEFAULTS, ["--batch_size=8", str(path), "--batch_size=4"])  # given again after it: the flag wins
    assert capsys.readouterr().err == ""
    configure(DEFAULTS, ["--batch_size=8", str(path), str(path)])  # said once, of the flag the first file set over
    assert capsys.readouterr().err.count("warning") == 1
    path.write_text("batch_size = batch_size * 2\n")  # built on the flag's value: the flag is not lost
    assert configure(DEFAULTS, ["--batch_size=8", str(path)])["batch_size"] == 16
    assert capsys.readouterr().err == ""
    path.write_text("batch_size = 64\nbatch_size = batch_size * 2\n")  # its own value only: lost
    assert configure(DEFAULTS, ["--batch_size=8", str(path)])["batch_size"] == 128
    assert "sets batch_size over --batch_size=8" in capsys.readouterr().err


def test_a_config_file_of_another_script_is_named_so_and_typos_still_get_the_closest_key(tmp_path):
    typos = tmp_path / "typos.py"
    typos.write_text("learning_rat = 1e-3\nbatchsize = 8\nn_gpus = 8\n")  # two typos and a stray name
    with pytest.raises(UserError, match="unknown config key 'learning_rat' .*did you mean 'learning_rate'"):
        configure(DEFAULTS, [str(typos)])
    other = tmp_path / "other.py"
    other.write_text("out_dir = 'out-char'\neval_interval = 250\nn_layer = 6\nmax_iters = 5000\nbatch_size = 64\n")
    with pytest.raises(UserError, match=r"'.*other.py' sets 3 settings this script does not have \(eval_interval, "
                                        r"n_layer, max_iters\): it reads as another script's config; for the out_dir "
                                        r"it names, pass --out_dir=out-char; see --help"):
        configure(DEFAULTS, [str(other)])
    other.write_text("eval_interval = 250\nn_layer = 6\nmax_iters = 5000\n")  # no out_dir of its own: no hint
    with pytest.raises(UserError, match=r"another script's config; see --help for this one's settings$"):
        configure(DEFAULTS, [str(other)])


def test_given_keys_are_the_flags_and_what_config_files_assign_as_they_run_whatever_the_value(tmp_path):
    exp = tmp_path / "exp.py"
    exp.write_text("import math\nbatch_size = 12  # the default, still a choice\nif True:\n    compile = False\n"
                   "if out_dir == 'elsewhere':\n    learning_rate = 1.0  # a branch not taken sets nothing\n"
                   "def helper():\n    wandb_run_name = 'never run'\n")
    given = set()
    configure(DEFAULTS, [str(exp), "--out_dir=out"], given=given)
    assert given == {"batch_size", "compile", "out_dir"}  # not imports, helpers, or what a skipped branch assigns


def test_config_file_errors(tmp_path):
    bad_key = tmp_path / "bad_key.py"
    bad_key.write_text("learning_rat = 1e-3\n")
    with pytest.raises(UserError, match="unknown config key 'learning_rat' in config file .*did you mean 'learning_rate'"):
        configure(DEFAULTS, [str(bad_key)])
    broken = tmp_path / "broken.py"
    broken.write_text("batch_size = = 3\n")
    with pytest.raises(UserError, match="line 1: syntax error"):
        configure(DEFAULTS, [str(broken)])
    with pytest.raises(UserError, match="config file 'nope.py' not found"):
        configure(DEFAULTS, ["nope.py"])
    if os.path.isfile("/proc/self/mem"):  # a file that open() refuses, even to root
        with pytest.raises(UserError, match=r"config file '/proc/self/mem' cannot be read \(.*\): check its permissions"):
            configure(DEFAULTS, ["/proc/self/mem"])


@pytest.mark.parametrize("name,text,problem", [
    ("c.py", "batch_size = 4\nn_layer: 2\n", r"line 2: 'n_layer: 2' sets nothing: a setting is `key = value`"),
    ("c.py", "batch_size == 4\n", r"line 1: 'batch_size == 4' sets nothing"),
    ("c.yaml", "batch_size: 4\n", r"is YAML: config files are Python"),
    ("c.json", '{"batch_size": 4}\n', r"is JSON: config files are Python"),
    ("c.py", "", r"sets nothing \(it has no `key = value` line\)"),
    ("c.py", '"""my sweep"""\n# batch_size = 4\n', r"sets nothing \(it has no `key = value` line\)"),
])
def test_a_config_file_that_would_set_nothing_is_refused(tmp_path, name, text, problem):
    """Each of these parses as Python, and ran on the defaults without a word."""
    (tmp_path / name).write_text(text)
    with pytest.raises(UserError, match=problem):
        configure(DEFAULTS, [str(tmp_path / name)])


def test_a_config_file_s_expressions_that_do_something_are_accepted(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("(batch_size := 4)\nprint('a') if batch_size else print('b')\nf'{batch_size}'\n"
                    "def helper(x):\n    x\n    n: int\n    return x\n"
                    "if batch_size:\n    learning_rate = helper(1e-3)\n")
    config = configure(DEFAULTS, [str(path)])
    assert config["batch_size"] == 4 and config["learning_rate"] == 1e-3
    path.write_text("if True:\n    pass\nelse:\n    batch_size: 3\n")  # in a block that runs when the file loads
    with pytest.raises(UserError, match=r"line 4: 'batch_size: 3' sets nothing"):
        configure(DEFAULTS, [str(path)])


def test_a_config_file_may_start_with_a_byte_order_mark_and_call_print_and_set_numpy_floats(tmp_path):
    path = tmp_path / "c.py"
    path.write_bytes(b"\xef\xbb\xbf" + b'"""a docstring"""\nimport numpy as np\nprint("hi")\nlearning_rate = np.float64(1e-3)\n')
    config = configure(DEFAULTS, [str(path)])
    assert config["learning_rate"] == 1e-3 and type(config["learning_rate"]) is float


def test_every_shipped_config_file_applies_to_train_defaults():
    import train
    defaults = train.config_defaults
    config_dir = os.path.join(os.path.dirname(train.__file__), "config")
    for name in sorted(os.listdir(config_dir)):
        # raises on any unknown key, wrong type or value that breaks a setting's rule
        configure(defaults, [os.path.join(config_dir, name)], train.__file__)


def test_help_lists_each_key_with_default_and_comment():
    import train
    text = describe(train.__file__, train.config_defaults)
    assert "--batch_size=12" in text and "sequences per micro-step per process" in text
    assert "optimizer:" in text and "learning rate schedule:" in text  # the section banners group the keys
    missing = [k for k in train.config_defaults if f"--{k}=" not in text]
    assert missing == []


def test_help_lists_exactly_the_config_block_with_no_empty_headings(tmp_path):
    import train
    result = run_script("train.py", "--help", cwd=str(tmp_path))
    listed = [line.split("=", 1)[0].strip()[2:] for line in result.stdout.splitlines() if line.startswith("  --")]
    assert listed == list(train.config_defaults)
    assert "EVAL_STREAM" not in train.config_defaults and "config_defaults" not in listed
    headings = [line for line in result.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings and all(len(h) > 1 for h in headings)


def test_a_helper_name_in_a_config_file_is_told_to_start_with_an_underscore(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text("n = 3\nbatch_size = n\n")
    with pytest.raises(UserError, match=r"^unknown config key 'n' in config file .*exp.py': a name the file only uses "
                                        r"itself must start with _ \(_n\), as names that do are not settings$"):
        configure(DEFAULTS, [str(path)])
    path.write_text("seed = 3\n")  # another script's setting, not used in the file: no helper
    with pytest.raises(UserError, match=r"^unknown config key 'seed' in config file .*exp.py'; see --help for the "
                                        r"keys \(a name of the file's own starts with _\)$"):
        configure(DEFAULTS, [str(path)])
    path.write_text("_n = 3\nbatch_size = _n\n")
    assert configure(DEFAULTS, [str(path)])["batch_size"] == 3
    path.write_text("w = 64\nd = 0.1\nh = 'x'\nbatch_size = w\nlearning_rate = d\nout_dir = h\n")  # helpers, not another script's settings
    with pytest.raises(UserError, match=r"^unknown config key 'w' in config file .*exp.py': a name the file only uses "
                                        r"itself must start with _ \(_w\)"):
        configure(DEFAULTS, [str(path)])


def test_a_module_constant_is_not_a_setting(tmp_path):
    result = run_script("train.py", "--EVAL_STREAM=7", cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["error: unknown config key 'EVAL_STREAM' in flag '--EVAL_STREAM=7'; "
                                                  "see --help for the keys"]


@pytest.mark.parametrize("script", ["train", "sample", "bench"])
def test_every_rule_parses_and_the_defaults_keep_them(script):
    module = __import__(script)
    found = rules(module.__file__, module.config_defaults)
    assert len(found) >= 5  # the sizes, rates and choices of each script have one
    check_rules(module.config_defaults, found)  # raises if a default breaks its own rule


def test_a_rule_may_relate_settings_and_names_them_in_the_error():
    found = {"learning_rate": "0 < learning_rate < inf", "min_lr": "0 <= min_lr <= learning_rate"}
    check_rules({"learning_rate": 1e-3, "min_lr": 1e-4}, found)
    with pytest.raises(UserError, match=r"^min_lr=0.01 is not valid: min_lr must satisfy 0 <= min_lr <= learning_rate "
                                        r"\(with learning_rate=0.001\)$"):
        check_rules({"learning_rate": 1e-3, "min_lr": 1e-2}, found)
    with pytest.raises(UserError, match=r"\(with learning_rate=1e-05\); min_lr was not given, so it kept its default: "
                                        r"give --min_lr as well$"):  # --learning_rate=1e-5 alone, below min_lr's default
        check_rules({"learning_rate": 1e-5, "min_lr": 6e-5}, found, given={"learning_rate"})
    with pytest.raises(UserError, match=r"\(with learning_rate=1e-05\)$"):  # both given: the one line as before
        check_rules({"learning_rate": 1e-5, "min_lr": 6e-5}, found, given={"learning_rate", "min_lr"})
    with pytest.raises(UserError, match="learning_rate=nan is not valid"):  # NaN fails every comparison
        check_rules({"learning_rate": float("nan"), "min_lr": 0.0}, found)
    with pytest.raises(UserError, match="n_embd=8 is not valid"):  # a rule that cannot be evaluated does not hold
        check_rules({"n_head": 0, "n_embd": 8}, {"n_embd": "n_embd % n_head == 0"})
    with pytest.raises(UserError, match=r"^to is empty: give --to=\.\.\.$"):  # export.py's folder, not given
        check_rules({"to": ""}, {"to": "to != ''"})


def test_help_shows_each_rule_beside_its_setting():
    import train
    text = describe(train.__file__, train.config_defaults)
    line = next(line for line in text.splitlines() if line.lstrip().startswith("--min_lr="))
    assert line.endswith("[0 <= min_lr and (min_lr <= learning_rate or not decay_lr or lr_schedule == 'constant')]")


def test_a_config_file_that_raises_names_its_line(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text("batch_size = 4\n\nlearning_rate = {}['missing']\n")
    with pytest.raises(UserError, match=r"exp.py' line 3 raised KeyError: 'missing'"):
        configure(DEFAULTS, [str(path)])


def test_auto_is_taken_only_where_the_rule_names_it(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("batch_size = 12  # sequences [batch_size == 'auto' or batch_size > 0]\n"
                      "n_layer = 6  # blocks [n_layer > 0]\n")
    config = {"batch_size": 12, "n_layer": 6}
    assert configure(config, ["--batch_size=auto"], str(script))["batch_size"] == "auto"
    assert configure(config, ["--batch_size=8"], str(script))["batch_size"] == 8
    with pytest.raises(UserError, match="'n_layer' .* must be int"):
        configure(config, ["--n_layer=auto"], str(script))
    with pytest.raises(UserError, match="'batch_size' .* must be int or 'auto'"):
        configure(config, ["--batch_size=big"], str(script))


def test_a_bench_compare_flag_takes_the_type_of_bench_s_default_not_of_config_a_s_auto():
    import bench
    a = {**bench.config_defaults, "batch_size": "auto"}
    assert bench.variants_of(a, "--batch_size=8")["B"]["batch_size"] == 8  # was the string '8', refused by the rule
    assert bench.variants_of({**a, "batch_size": 4}, "--batch_size=auto")["B"]["batch_size"] == "auto"


def test_a_bench_compare_config_resolves_device_auto_and_may_not_set_how_configs_are_timed(tmp_path):
    import bench
    a = {**bench.config_defaults, "device": "cpu"}  # A's device, resolved
    assert bench.variants_of(a, "--device=auto --dropout=0.1")["B"]["device"] == bench.resolve_device("auto")
    script = tmp_path / "b.py"  # a config file among the flags: its timing settings would be shown, then ignored
    script.write_text("num_steps = 50\nbatch_size = 4\n")
    with pytest.raises(UserError, match=r"sets num_steps, which say how every config is timed, not what one costs"):
        bench.variants_of(a, str(script))


def test_a_star_import_s_names_are_imports_not_another_script_s_settings(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("from math import *\nlearning_rate = 1e-3 * sqrt(4)\n")
    assert configure(DEFAULTS, [str(path)])["learning_rate"] == 2e-3

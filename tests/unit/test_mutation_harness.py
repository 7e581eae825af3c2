"""benchmarks/mutation.py: what it asks mutmut for and how it reads the answer."""

from configparser import ConfigParser

from benchmarks import mutation


def test_mutmut_is_told_to_mutate_only_the_chosen_modules_with_every_package_importable():
    cfg = ConfigParser()
    cfg.read_string(mutation.setup_cfg(["apps/lessor/pmpt.py", "controller/api.py"], "tests/unit"))
    m = cfg["mutmut"]
    assert [x for x in m["source_paths"].split("\n") if x] == [f"{p}/" for p in mutation.PACKAGES]
    assert [x for x in m["only_mutate"].split("\n") if x] == ["apps/lessor/pmpt.py", "controller/api.py"]
    assert [x for x in m["pytest_add_cli_args_test_selection"].split("\n") if x] == ["tests/unit"]
    assert "examples/" in m["also_copy"] and "pytest.ini" in m["also_copy"]
    # the layering test reads source text, and mutmut's copy imports mutmut everywhere: not run there
    assert "--ignore=tests/unit/test_architecture.py" in m["pytest_add_cli_args"].split("\n")


def test_results_are_grouped_by_module_and_status():
    mods = ["apps/lessor/pmpt.py", "apps/lessor/pre.py", "controller/api.py"]
    text = """    apps.lessor.pmpt.x_pmpt__mutmut_1: killed
    apps.lessor.pmpt.x_pmpt__mutmut_2: survived
    apps.lessor.pre.xǁFlowTableǁupdate__mutmut_7: no tests
    controller.api.x_route__mutmut_3: timeout
    noise that is not a result
"""
    got = mutation.parse_results(text, mods)
    assert dict(got["apps/lessor/pmpt.py"]) == {"killed": ["apps.lessor.pmpt.x_pmpt__mutmut_1"],
                                                "survived": ["apps.lessor.pmpt.x_pmpt__mutmut_2"]}
    assert dict(got["controller/api.py"]) == {"timeout": ["controller.api.x_route__mutmut_3"]}
    assert dict(got["apps/lessor/pre.py"]) == {"no tests": ["apps.lessor.pre.xǁFlowTableǁupdate__mutmut_7"]}
    assert mutation.module_of("apps.lessor.pmpt_extra.x_f__mutmut_1", mods) == "?"   # a prefix is not a module
    lines = mutation.table(got, mods)
    assert lines[1].split()[:5] == ["apps/lessor/pmpt.py", "2", "1", "1", "0"] and "50.0%" in lines[1]
    assert "< target" in lines[1] and lines[3].split()[:5] == ["controller/api.py", "1", "0", "0", "1"]


def test_the_issues_named_mutants_still_name_code_that_exists_once():
    """Each of issue #33's twelve mutants replaces text found exactly once
    in its module, and names unit tests that exist: the list cannot rot
    silently when the code moves."""
    assert len(mutation.NAMED) == 12
    for what, module, old, new, tests in mutation.NAMED:
        assert (mutation.ROOT / module).read_text().count(old) == 1, what
        assert old != new and tests.split(), what
        assert all((mutation.ROOT / t).is_file() for t in tests.split()), what

"""The example configuration exists three times for three readers: the README, the shipped
envoy.yaml, and filter/example-config.json (the filter's own tests load it). They must say
the same thing; the filter's tests prove that one is valid, this proves the others equal it."""

import json
import re
from pathlib import Path

from testbed.stack import default_plugin

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_readme_envoy_yaml_and_example_config_agree():
    example = json.loads((ROOT / "filter" / "example-config.json").read_text())
    readme = (ROOT / "README.md").read_text()
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", readme, re.S)]
    plugin_blocks = [b for b in blocks if "rules" in b]
    assert plugin_blocks, "the README shows a plugin configuration"
    assert plugin_blocks[0] == example
    assert default_plugin() == example

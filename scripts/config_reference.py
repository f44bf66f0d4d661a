"""Write docs/config-reference.md from the configuration schema (src/counterfactory/resources/config_schema.yaml).

    python scripts/config_reference.py            # from the repository root

tests/test_config.py checks that the committed page equals the generated text, so edit the schema and rerun this.
"""

from __future__ import annotations

from pathlib import Path

from counterfactory.config import write_reference

if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    print(write_reference(root / "docs" / "config-reference.md"))

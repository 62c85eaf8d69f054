"""Parses an OpenMetrics exposition (stdin) with prometheus_client's strict parser, which
refuses the whole text on any error (a name exported twice, a bad histogram, ...), and prints
its families as JSON: {name: {"type", "help", "samples": [[name, labels, value], ...]}}."""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

families = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    if family.name in families:
        sys.exit(f"family {family.name} twice")
    families[family.name] = {
        "type": family.type,
        "help": family.documentation,
        "samples": [[s.name, s.labels, s.value] for s in family.samples],
    }
json.dump(families, sys.stdout)

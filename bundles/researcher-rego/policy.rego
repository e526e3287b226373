# The Rego twin of bundles/researcher.yaml.
package researcher

import rego.v1

approved_model if {
	some prefix in data.researcher.model_prefixes
	startswith(input.target, prefix)
}

search_tool if input.target in data.researcher.tools

search_tool if startswith(input.target, "arxiv/")

decision := {
	"decision": "allow",
	"rule_id": "allow-models",
	"budget": {"max_tokens": 200000, "on_exceed": "require_approval"},
	"approval_config": {"approvers": ["research-leads"]},
} if {
	input.kind == "llm_call"
	approved_model
} else := {
	"decision": "allow",
	"rule_id": "allow-search-tools",
	"rate_limit": {"max_calls": 30, "window": "1m", "per_what": "execution"},
} if {
	input.kind == "tool_call"
	search_tool
} else := {"decision": "deny", "rule_id": "deny-other-models", "reason": "model not approved for research"} if {
	input.kind == "llm_call"
}

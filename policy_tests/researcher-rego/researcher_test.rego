# Unit tests for bundles/researcher-rego (inputs set field by field, never `with input as {...}`).
package researcher_test

import rego.v1

test_approved_model_is_allowed_with_a_budget if {
	d := data.researcher.decision with input.kind as "llm_call" with input.target as "claude-sonnet-4"
	d.rule_id == "allow-models"
	d.budget.max_tokens == 200000
}

test_arxiv_tools_are_rate_limited if {
	d := data.researcher.decision with input.kind as "tool_call" with input.target as "arxiv/search"
	d.rule_id == "allow-search-tools"
	d.rate_limit.max_calls == 30
}

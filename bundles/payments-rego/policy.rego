# The Rego twin of bundles/payments.yaml: the same decisions, rule ids and options. The rules are
# disjoint, so deny-overrides and the YAML file's first match agree.
package payments

import rego.v1

threshold := data.payments.approval_threshold

read_only if {
	input.target in data.payments.read_only
}

allowlisted if {
	is_string(input.args.command)
	input.args.command in data.payments.shell_allowlist
}

# The amount is a JSON number: the string "500", null or a missing amount never is.
amount := input.args.amount if {
	is_number(input.args.amount)
}

decision contains {"decision": "allow", "rule_id": "allow-read-only"} if {
	read_only
}

decision contains {"decision": "allow", "rule_id": "allow-allowlisted-shell"} if {
	input.target == "shell"
	allowlisted
}

decision contains {
	"decision": "deny",
	"rule_id": "deny-shell",
	"reason": "shell commands must be on the allowlist",
} if {
	input.target == "shell"
	not allowlisted
}

decision contains {
	"decision": "require_approval",
	"rule_id": "approve-large-transfer",
	"reason": "transfers above 1000 need finance",
	"approval_config": {
		"approvers": ["finance"],
		"timeout": "1h",
		"message": "The payments bot wants to move more than 1000.",
	},
} if {
	input.target == "transfer_funds"
	amount > threshold
}

decision contains {"decision": "allow", "rule_id": "allow-small-transfer"} if {
	input.target == "transfer_funds"
	amount > 0
	amount <= threshold
}

decision contains {
	"decision": "allow",
	"rule_id": "rate-limit-llm",
	"rate_limit": {"max_calls": 30, "window": "1m", "per_what": "execution"},
} if {
	input.kind == "llm_call"
}

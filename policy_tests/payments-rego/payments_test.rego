# Unit tests for bundles/payments-rego (inputs set field by field: see docs/testing-policies.md).
package payments_test

import rego.v1

test_large_transfer_needs_finance if {
	some d in data.payments.decision with input.target as "transfer_funds" with input.args.amount as 5000
	d.rule_id == "approve-large-transfer"
	"finance" in d.approval_config.approvers
}

test_string_amount_is_not_a_number if {
	count(data.payments.decision) == 0 with input.target as "transfer_funds" with input.args.amount as "5000"
}

test_allowlisted_shell if {
	some d in data.payments.decision with input.target as "shell" with input.args.command as "pwd"
	d.rule_id == "allow-allowlisted-shell"
}

# Unit tests for bundles/shell-rego. Inputs are set field by field (`with input.x as ...`):
# `with input as {...}` crashes regopy when the rule calls a builtin on input (docs/testing-policies.md).
package shell_test

import rego.v1

test_read_only_command_is_allowed if {
	d := data.shell.decision with input.target as "shell_exec" with input.args.command as "ls -la /tmp"
	d.rule_id == "allow-read-only"
	d.decision == "allow"
}

test_chained_command_needs_approval if {
	d := data.shell.decision with input.target as "shell_exec" with input.args.command as "ls; rm -rf /"
	d.rule_id == "block-chaining"
	"oncall" in d.approval_config.approvers
}

test_other_command_needs_approval if {
	d := data.shell.decision with input.target as "shell_exec" with input.args.command as "curl example.com"
	d.rule_id == "approve-other-commands"
}

todo_test_sudo_is_denied if {
	false
}

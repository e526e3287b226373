# The Rego twin of bundles/shell.yaml: the same decisions, rule ids and approval options.
package shell

import rego.v1

chained if regex.match(data.shell.chain_pattern, input.args.command)

read_only if regex.match(data.shell.read_only_pattern, input.args.command)

shell_call if {
	input.target == "shell_exec"
	is_string(input.args.command)
}

approval := {"approvers": ["oncall"], "timeout": "15m"}

decision := {
	"decision": "require_approval",
	"rule_id": "block-chaining",
	"reason": "chained or redirected commands need a human",
	"approval_config": object.union(approval, {"message": "The shell agent wants to run a compound command."}),
} if {
	shell_call
	chained
} else := {"decision": "allow", "rule_id": "allow-read-only"} if {
	shell_call
	read_only
} else := {
	"decision": "require_approval",
	"rule_id": "approve-other-commands",
	"reason": "not on the read-only list",
	"approval_config": approval,
} if {
	input.target == "shell_exec"
}

# The Rego twin of bundles/filesystem.yaml.
package filesystem

import rego.v1

fs_tool if startswith(input.target, "fs/")

secret_path if regex.match(data.filesystem.secret_pattern, input.args.path)

writes if input.target == "fs/write_file"

writes if {
	some prefix in ["fs/delete", "fs/move"]
	startswith(input.target, prefix)
}

writes if {
	fs_tool
	contains(input.target, "chmod")
}

decision := {"decision": "deny", "rule_id": "protect-secrets", "reason": "secrets are off limits"} if {
	fs_tool
	secret_path
} else := {
	"decision": "require_approval",
	"rule_id": "writes-need-approval",
	"approval_config": {"timeout": "30m", "message": "The filesystem agent wants to change files."},
} if {
	writes
}

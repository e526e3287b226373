# Unit tests for bundles/filesystem-rego (inputs set field by field, never `with input as {...}`).
package filesystem_test

import rego.v1

test_secrets_are_denied if {
	d := data.filesystem.decision with input.target as "fs/read_file" with input.args.path as "/app/.env"
	d.rule_id == "protect-secrets"
}

test_writes_need_approval if {
	d := data.filesystem.decision with input.target as "fs/write_file" with input.args.path as "/tmp/x"
	d.rule_id == "writes-need-approval"
}

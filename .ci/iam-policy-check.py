#!/usr/bin/env python3
"""The shipped IAM policies allow what the DynamoDB store calls, no more.

Reads every SDK operation the store calls (the fluent builder calls such as
`.batch_get_item()` in src/lease/dynamodb/, tests aside) and fails, one line
per problem, when:

- config/iam/leaderd-policy-with-create.json lacks the IAM action of any of
  them (a TransactWriteItems needs those of the item kinds it is made of:
  dynamodb:PutItem for a `Put`);
- config/iam/leaderd-policy.json lacks the action of a call made outside
  table creation (everything but CreateTable and UpdateTimeToLive);
- either file allows an action no call needs (they are documented as the
  least privilege);
- a policy shown in README.md or helm/leaderd/README.md allows other actions
  than the file it shows (a block that allows CreateTable shows the create
  policy, any other the runtime one);
- config/iam/README.md does not say what an allowed action is for;
- a policy (a file or one shown) allows dynamodb:DeleteItem other than in a
  statement of its own confined to `leaderd check`'s scratch records (the
  `dynamodb:LeadingKeys` condition on the prefix src/core/keys.rs names):
  leaderd's credentials must never delete an election's record;
- the errors of a call are not classified with its own action (the next
  `Action::…` after the call), so that a denied call would name another.

Run from anywhere: python3 .ci/iam-policy-check.py
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "src/lease/dynamodb"
RUNTIME = "config/iam/leaderd-policy.json"
CREATE = "config/iam/leaderd-policy-with-create.json"
IAM_README = "config/iam/README.md"
DOCS = ["README.md", "helm/leaderd/README.md"]

# Operations only table creation calls: the runtime policy goes without.
CREATE_ONLY = {"create_table", "update_time_to_live"}

# Every operation of the DynamoDB API, as the Rust SDK's client names it.
OPERATIONS = set(
    """
    batch_execute_statement batch_get_item batch_write_item create_backup
    create_global_table create_table delete_backup delete_item
    delete_resource_policy delete_table describe_backup
    describe_continuous_backups describe_contributor_insights
    describe_endpoints describe_export describe_global_table
    describe_global_table_settings describe_import
    describe_kinesis_streaming_destination describe_limits describe_table
    describe_table_replica_auto_scaling describe_time_to_live
    disable_kinesis_streaming_destination enable_kinesis_streaming_destination
    execute_statement execute_transaction export_table_to_point_in_time
    get_item get_resource_policy import_table list_backups
    list_contributor_insights list_exports list_global_tables list_imports
    list_tables list_tags_of_resource put_item put_resource_policy query
    restore_table_from_backup restore_table_to_point_in_time scan
    search_vectors tag_resource transact_get_items transact_write_items
    untag_resource update_continuous_backups update_contributor_insights
    update_global_table update_global_table_settings update_item
    update_kinesis_streaming_destination update_table
    update_table_replica_auto_scaling update_time_to_live
    """.split()
)

# Operations whose IAM actions are not their own name (PartiQL statements
# and transactions are authorised per item action): this script cannot
# tell what they need.
UNMAPPED = {
    "batch_execute_statement",
    "execute_statement",
    "execute_transaction",
    "transact_get_items",
}

# A TransactWriteItems is authorised per item, by the action of the item's
# kind (AWS: "Permissions for Put, Update, Delete, and Get actions are
# governed by the permissions used for the underlying PutItem, UpdateItem,
# DeleteItem, and GetItem operations"; ConditionCheck by
# dynamodb:ConditionCheckItem). The store's transactions need the actions
# of the item kinds it builds (`Put::builder()` …).
BY_ITEM = {"transact_write_items"}
ITEM_KINDS = {
    "Put": "put_item",
    "Update": "update_item",
    "Delete": "delete_item",
    "ConditionCheck": "condition_check_item",
}
ITEM_BUILDER = re.compile(r"\b(Put|Update|Delete|ConditionCheck)::builder\s*\(")

# Actions allowed only on `leaderd check`'s scratch records.
SCRATCH_ONLY = {"dynamodb:DeleteItem"}
KEYS = ROOT / "src/core/keys.rs"
CHECK_PREFIX = re.compile(r'pub const CHECK_PREFIX: &str = "([^"]+)";')

CALL = re.compile(r"\.\s*([a-z][a-z0-9_]*)\s*\(\s*\)")
CLASSIFIED_AS = re.compile(r"\bAction::([A-Za-z]+)")
JSON_BLOCK = re.compile(r"^[ \t]*```json[ \t]*\n(.*?)^[ \t]*```", re.S | re.M)


def action(op):
    """The IAM action of an SDK operation: get_item -> dynamodb:GetItem."""
    return "dynamodb:" + "".join(part.capitalize() for part in op.split("_"))


def item_ops():
    """The item operations the store's transactions are made of."""
    kinds = set()
    for path in sorted(STORE.rglob("*.rs")):
        if path.name != "tests.rs":
            kinds.update(ITEM_BUILDER.findall(path.read_text()))
    return {ITEM_KINDS[k] for k in kinds}


def needed_actions(op, items):
    """The IAM actions an SDK operation needs."""
    if op in BY_ITEM:
        return {action(i) for i in items}
    return {action(op)}


def calls(problems):
    """Each operation the store calls, with the first place that calls it."""
    found = {}
    items = item_ops()
    for path in sorted(STORE.rglob("*.rs")):
        # Unit tests build requests of their own; they run with no policy.
        if path.name == "tests.rs":
            continue
        lines = [line.split("//", 1)[0] for line in path.read_text().splitlines()]
        code = "\n".join(lines)
        for call in CALL.finditer(code):
            op = call.group(1)
            if op not in OPERATIONS:
                continue
            number = code.count("\n", 0, call.start()) + 1
            where = f"{path.relative_to(ROOT)}:{number}"
            found.setdefault(op, where)
            named = CLASSIFIED_AS.search(code, call.end())
            owns = {a.split(":", 1)[1] for a in needed_actions(op, items)}
            own = " or ".join(sorted(owns))
            if op not in UNMAPPED and (named is None or named.group(1) not in owns):
                problems.append(
                    f"{where}: the errors of `.{op}()` must be classified as Action::{own} "
                    f"(the next one after it is {named.group(0) if named else 'none'})"
                )
    return found


def allowed(policy):
    """The actions a policy document allows, and its resources."""
    actions, resources = set(), set()
    for statement in policy.get("Statement", []):
        if statement.get("Effect") != "Allow":
            continue
        for key, into in (("Action", actions), ("Resource", resources)):
            value = statement.get(key, [])
            into.update([value] if isinstance(value, str) else value)
    return actions, resources


def scratch_prefix(problems):
    """The key prefix of `leaderd check`'s scratch records."""
    found = CHECK_PREFIX.search(KEYS.read_text())
    if found is None:
        problems.append(f"{KEYS.relative_to(ROOT)}: no CHECK_PREFIX (has it moved?)")
        return "#check/"
    return found.group(1)


def unconfined(policy, prefix):
    """Why a policy allows a scratch-only action beyond the scratch records."""
    want = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [prefix + "*"]}}
    for statement in policy.get("Statement", []):
        if statement.get("Effect") != "Allow":
            continue
        value = statement.get("Action", [])
        actions = {value} if isinstance(value, str) else set(value)
        scratch = sorted(actions & SCRATCH_ONLY)
        if not scratch:
            continue
        if actions - SCRATCH_ONLY:
            yield f"allows {', '.join(scratch)} in a statement with other actions"
        if statement.get("Condition") != want:
            yield (
                f"allows {', '.join(scratch)} without the condition {json.dumps(want)}, "
                "which confines it to leaderd check's scratch records"
            )


def load(rel, problems):
    try:
        return json.loads((ROOT / rel).read_text())
    except (OSError, ValueError) as e:
        problems.append(f"{rel}: cannot read the policy: {e}")
        return {}


def main():
    problems = []
    made = calls(problems)
    if not made:
        problems.append(
            f"{STORE.relative_to(ROOT)}: found no DynamoDB call (has the store moved?)"
        )
    for op in sorted(UNMAPPED & made.keys()):
        problems.append(
            f"{made[op]}: calls `.{op}()`, whose IAM actions this check cannot "
            "name; extend .ci/iam-policy-check.py"
        )

    policies = {rel: load(rel, problems) for rel in (RUNTIME, CREATE)}
    prefix = scratch_prefix(problems)
    for rel, policy in policies.items():
        for why in unconfined(policy, prefix):
            problems.append(f"{rel}: {why}")
    items = item_ops()
    needs = {
        CREATE: {
            name: where
            for op, where in made.items()
            for name in needed_actions(op, items)
        },
        RUNTIME: {
            name: where
            for op, where in made.items()
            if op not in CREATE_ONLY
            for name in needed_actions(op, items)
        },
    }
    for rel, needed in needs.items():
        actions, _ = allowed(policies[rel])
        for name in sorted(needed.keys() - actions):
            problems.append(
                f"{rel}: lacks {name}, which {needed[name]} calls; add it to the policy"
            )
        for name in sorted(actions - needed.keys()):
            problems.append(
                f"{rel}: allows {name}, which no call needs; remove it (the policy is the least privilege)"
            )

    iam_readme = (ROOT / IAM_README).read_text()
    for name in sorted(allowed(policies[CREATE])[0]):
        short = name.split(":", 1)[-1]
        if not re.search(rf"\b{re.escape(short)}\b", iam_readme):
            problems.append(f"{IAM_README}: does not say what {name} is for")

    for doc in DOCS:
        blocks = []
        for block in JSON_BLOCK.findall((ROOT / doc).read_text()):
            if '"dynamodb:' not in block:
                continue
            try:
                blocks.append(json.loads(block))
            except ValueError as e:
                problems.append(f"{doc}: a policy shown is not valid JSON: {e}")
        if not blocks:
            problems.append(f"{doc}: shows no IAM policy (a ```json block)")
        for shown in blocks:
            for why in unconfined(shown, prefix):
                problems.append(f"{doc}: the policy shown {why}")
            actions, resources = allowed(shown)
            rel = CREATE if "dynamodb:CreateTable" in actions else RUNTIME
            want_actions, want_resources = allowed(policies[rel])
            for name in sorted(want_actions - actions):
                problems.append(f"{doc}: the policy shown lacks {name}, which {rel} allows")
            for name in sorted(actions - want_actions):
                problems.append(f"{doc}: the policy shown allows {name}, which {rel} does not")
            if resources != want_resources:
                problems.append(
                    f"{doc}: the policy shown names resources {sorted(resources)}, {rel} {sorted(want_resources)}"
                )

    for line in problems:
        print(f"iam-policy-check: {line}", file=sys.stderr)
    if problems:
        return 1
    wanted = sorted({name for op in made for name in needed_actions(op, items)})
    print(
        f"iam-policy-check: the policies allow the {len(wanted)} IAM actions the "
        f"{len(made)} DynamoDB operations the store calls need ({', '.join(wanted)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Bearer tokens and roles: who may query, who may report progress, who may administer."""

"""One object created, changed or deleted, applied to an analysis in place: the fast path of the
controller, the webhook and the gateway (`apply.apply_change`, the one entry point). Each module
imports only those above it in this list:

- `base`: the object index kept in order, the path nodes by level, the tree walks, the routes by
  what they name;
- `recompute`: effective policies and what affects each object, computed again for the nodes a
  change reaches;
- `policies`: a policy created, changed or deleted, a policy resolved again;
- `edit`: the paths one change to the hierarchy takes away and adds, settled together;
- `hierarchy`: routes, Gateways, Services, Namespaces, ReferenceGrants;
- `apply`: `apply_change` for any kind, and `prepare` after a full analysis.
"""

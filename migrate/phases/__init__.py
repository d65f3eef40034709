"""The handlers of the migration's phases, one module per step of the protocol (or per
family of phases): each handler is a function ``(m: Migration, ctx: Context) -> None`` that
acts for the record's phase.  The order, the numbers and where a resume re-enters are
:mod:`migrate.protocol`'s; :data:`migrate.runner.HANDLERS` maps each phase to its handler."""

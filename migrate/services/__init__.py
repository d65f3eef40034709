"""The small services the migration phases call: topic administration
(:mod:`~migrate.services.topics`), the ``theseus run`` processes a migration starts, stops
and watches (:mod:`~migrate.services.processes`), and the gates it arms
(:mod:`~migrate.services.arming`)."""

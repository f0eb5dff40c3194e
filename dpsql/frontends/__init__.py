"""Front ends: the ways people reach dpsql (CLI, shell, dbt, Spark). Nothing in the package imports them."""

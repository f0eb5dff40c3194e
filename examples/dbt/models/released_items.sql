-- Items released by user-level (epsilon = 1, delta = 1e-5)-DP set union (Weighted Gaussian).
-- One column, `item`; the noisy weights never leave the query. Every run draws fresh noise.
-- Materialized as a table (dbt_project.yml): the rows are stored once; a view would release again on every read.
select * from dp_set_union_weighted_gaussian('{{ ref("user_items") }}', epsilon := 1.0, delta := 1e-5)

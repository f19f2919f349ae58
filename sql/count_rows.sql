-- Used only when the statistics know nothing yet about a table.
SELECT count(*) FROM {table} WHERE embedding IS NOT NULL

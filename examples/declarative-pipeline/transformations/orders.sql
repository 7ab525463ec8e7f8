-- The current rows of public.orders, from its changes: per key the latest change after
-- the last TRUNCATE, unless it is a delete. tidemark's change columns start with "_".
CREATE MATERIALIZED VIEW orders AS
SELECT * EXCEPT (_op, _lsn, _commit_lsn, _seq, _commit_ts, _txid, _unavailable, _truncated,
                 _latest)
FROM (
    SELECT *, row_number() OVER (PARTITION BY id
                                 ORDER BY _commit_lsn DESC, _seq DESC) AS _latest
    FROM (
        SELECT *, max(CASE WHEN _op = 't' THEN _commit_lsn END) OVER () AS _truncated
        FROM orders_changes
    )
    WHERE (_truncated IS NULL OR _commit_lsn > _truncated) AND _op <> 't'
)
WHERE _latest = 1 AND _op <> 'd'

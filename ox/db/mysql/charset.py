"""What MariaDB/MySQL must give ox's tables: all of Unicode (utf8mb4; `utf8` is three bytes
there and refuses emoji), and a collation that compares queue names, limit keys and unique
keys as PostgreSQL does: by their bytes (case-sensitive) and without padding (`utf8mb4_bin`
pads on MariaDB: 'acct' = 'acct ' there, so two limit keys or two unique keys would be one).
Asked of the server rather than read from a collation's name: MariaDB and MySQL name and
pad their collations differently."""

from django.db.backends.base.base import BaseDatabaseWrapper


def collation_problems(conn: BaseDatabaseWrapper) -> list[str]:
    """What is wrong with the collation ox's tables have (ox_task's, or the database's
    default before the first migrate); empty when nothing is."""
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE((SELECT TABLE_COLLATION FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'ox_task'),"
            " (SELECT DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = DATABASE()))"
        )
        collation = cursor.fetchone()[0]
        if collation is None:
            return []
        where = f"collation {collation}"
        if not collation.startswith("utf8mb4_"):
            return [f"{where} is not utf8mb4: text outside the Basic Multilingual Plane (emoji) is refused"]
        quoted = collation.replace("`", "")
        cursor.execute(
            f"SELECT _utf8mb4'a' COLLATE {quoted} = _utf8mb4'a ', _utf8mb4'a' COLLATE {quoted} = _utf8mb4'A'"
        )
        pads, folds = cursor.fetchone()
    problems = []
    if pads:
        problems.append(f"{where} pads: 'a' and 'a ' are one queue name, limit key or unique key")
    if folds:
        problems.append(f"{where} ignores case: 'a' and 'A' are one queue name, limit key or unique key")
    return problems

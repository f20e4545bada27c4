"""Reading a traced graph in tests."""


def ancestors(op) -> set:
    """Every op ``op`` waits for in its graph (data and control inputs)."""
    seen: set = set()
    todo = [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen

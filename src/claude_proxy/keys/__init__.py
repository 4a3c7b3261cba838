"""Keys for people and their money: the key ring, the client key check, budgets and limits,
spend, the usage routes and the usage log."""

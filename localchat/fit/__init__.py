"""Whether a model fits this machine: its shape from config and headers, the memory it takes at a
context, the budget the machine gives, and the verdict every load checks first."""

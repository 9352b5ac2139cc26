"""GPU models and their prices: the parsed model names (memory, MIG profiles) and the shipped
GPU catalog (list price and cost per GPU-hour). A leaf: it imports nothing from the domain, so
the fleet, placement and the hardware adapters all read it from below."""

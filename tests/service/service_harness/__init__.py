"""The service tests' harness (no tests here): `kit` builds the rated warehouse, starts a real
uvicorn server and calls it; `drain_burst` is the script that runs real drains in another
process, as the loop's drain job writes the warehouse beside the service."""

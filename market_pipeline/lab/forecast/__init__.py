"""The forecaster offline: synthetic pool demand (`synthetic`) and `bench forecast`."""

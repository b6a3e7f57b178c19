"""LVIS evaluation: AP, AP_r/c/f, AP^Fixed."""

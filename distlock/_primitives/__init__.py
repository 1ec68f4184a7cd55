"""TODO primitives"""

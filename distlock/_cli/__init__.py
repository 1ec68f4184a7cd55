"""TODO cli"""

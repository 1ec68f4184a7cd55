"""TODO redis"""

"""TODO core"""

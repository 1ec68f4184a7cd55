"""TODO testing"""
